"""`LookupDrafter`: drafts the continuation of the current suffix from an index over seen tokens."""

import math
from dataclasses import dataclass, field

import numpy as np

from lookahead.documents import DocumentLibrary
from lookahead.index import TokenIndex
from lookahead.index.trie import DraftTrie
from lookahead.store import TokenStore
from lookahead.integrations.transformers import TransformersAssistant

# Defaults measured with `lookahead replay` on ../shared/traces (README, "Choosing the defaults").
DEFAULT_NUM_DRAFT_TOKENS = 64  # a ceiling: the verification loops cut drafts to what pays on the hardware (cost_aware)
DEFAULT_MIN_NGRAM = 1
DEFAULT_MAX_NGRAM = 8
DEFAULT_DRAFT_FACTOR = 16.0  # a 1-token match drafts up to 16 tokens, 4 tokens up to 64; the loops cut by cost
DEFAULT_MEMORY_TOKENS = 262_144  # about 15 MB
# Candidate weights (see LookupDrafter._fill_trie), measured with `lookahead replay --tree`.
MATCH_WEIGHT = 2.0  # per matched token: a longer match outweighs two shorter ones
STORE_WEIGHT = 0.5  # a store's match counts as one token shorter than the request's own
SUBSTITUTION_WEIGHT = 0.25  # a substitution counts as two tokens shorter
SKIP_WEIGHT = 1.0  # the model skipped a source token: counts as a match of the tokens before it
TREE_DEPTH_DECAY = 0.9  # a tree node counts 10% less per level: the model may leave every candidate

_EMPTY_IDS = np.zeros(0, dtype=np.int64)
_EMPTY_IDS.flags.writeable = False
_CHAIN_PARENTS = np.arange(256, dtype=np.int64) - 1  # [-1, 0, 1, ...]: shared, read-only
_CHAIN_PARENTS.flags.writeable = False


@dataclass(frozen=True)
class Draft:
    """Proposed tokens: a tree given by parent indices; a chain has parents [-1, 0, 1, ...].

    `token_ids[i]` follows `parents[i]` (-1: follows the current sequence). An empty
    draft (no proposal; the verifier takes a plain step) has empty arrays.
    `match_len` is the length of the suffix the draft was anchored on (0: none).
    """

    token_ids: np.ndarray  # (num_nodes,) int64
    parents: np.ndarray  # (num_nodes,) int64, parents[i] < i
    match_len: int = 0

    def __len__(self) -> int:
        return self.token_ids.shape[0]

    @classmethod
    def chain(cls, token_ids: np.ndarray, match_len: int = 0) -> "Draft":
        n = token_ids.shape[0]
        parents = _CHAIN_PARENTS[:n] if n <= _CHAIN_PARENTS.shape[0] else np.arange(n, dtype=np.int64) - 1
        return cls(token_ids, parents, match_len)

    def prefix(self, num_nodes: int) -> "Draft":
        """The first `num_nodes` nodes (a chain's first tokens; parents precede children, so a subtree)."""
        return Draft(self.token_ids[:num_nodes], self.parents[:num_nodes], self.match_len if num_nodes else 0)


EMPTY_DRAFT = Draft(_EMPTY_IDS, _EMPTY_IDS, 0)


@dataclass
class DraftStats:
    """What a drafter proposed and what verification kept, over one generate call.

    A step is one verify forward pass; it produces `accepted` drafted tokens plus one
    token of the model's own, so tokens = accepted + steps. Through transformers' loop a
    step's acceptance is seen at the next step, so the last step counts 0 accepted.
    """

    drafted_per_step: list[int] = field(default_factory=list)
    accepted_per_step: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.drafted_per_step)

    @property
    def drafted(self) -> int:
        return sum(self.drafted_per_step)

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_step)

    @property
    def tokens(self) -> int:
        return self.accepted + self.steps

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens per verify step (τ); 0.0 before the first step."""
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def record(self, drafted: int, accepted: int = 0) -> None:
        """Counts one verify step that checked `drafted` tokens and kept `accepted` of them."""
        self.drafted_per_step.append(drafted)
        self.accepted_per_step.append(0)
        self.record_accepted(accepted)

    def record_accepted(self, accepted: int) -> None:
        """Sets how many drafted tokens the last step kept."""
        drafted = self.drafted_per_step[-1]
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted must be in [0, drafted={drafted}], got {accepted}")
        self.accepted_per_step[-1] = accepted

    def __repr__(self) -> str:
        return (
            f"DraftStats(steps={self.steps}, drafted={self.drafted}, accepted={self.accepted}, "
            f"tokens_per_step={self.tokens_per_step:.2f})"
        )


class LookupDrafter(TransformersAssistant):
    """Drafts what followed the current suffix where it occurred before.

    Pass it to transformers as `model.generate(**inputs, assistant_model=LookupDrafter())`:
    outputs are token for token those of `model.generate(**inputs)` (greedy) or sampled
    from the same distribution (`do_sample=True`). It indexes the prompt and every
    verified token, never rejected drafts; it can also copy from reference documents
    (`add_document`) and from what earlier requests wrote (`memory`).

    Each draft merges the continuations of many earlier occurrences into a weighted trie
    (`_fill_trie`): longer matches weigh more, agreeing occurrences add up, and after a
    token the model replaced, copying resumes where it left off. A chain is the
    trie's heaviest path, a tree its heaviest nodes.

    Lifecycle (what a verification loop calls): `reset(prompt_ids)`, then per step
    `propose(max_tokens)` (or `propose_tree`) and `extend(verified_ids)`; `stats`
    describes the current request.

    Args:
        num_draft_tokens: most tokens proposed per step (per branch, for trees).
        min_ngram: shortest suffix that may anchor a draft.
        max_ngram: longest suffix tried; longer matches are preferred.
        draft_factor: a draft anchored on an m-token match has at most ceil(draft_factor * m)
            tokens. The default caps only drafts anchored on 1-3 tokens: which drafted
            tokens are worth verifying depends on the hardware, and the loops decide that
            (cost_aware).
        memory: what earlier requests wrote: True (default) for a private TokenStore of
            DEFAULT_MEMORY_TOKENS tokens, a TokenStore to share one between drafters (and
            threads), False for none. Each request's prompt and output are added to it when
            the next request starts; its continuations weigh as much as the request's
            own for a match one token shorter.
        documents: a DocumentLibrary of reference documents (an empty private one if not
            given; see add_document). Each request consults those sharing text with its
            prompt. Weighed like memory; preferred to it on ties.
        eos_token_id: token id(s) a draft never runs past (transformers' loop sets it
            from the generation config).
        cost_aware: in transformers' loop, cut each draft to the length worth verifying on
            the target (lookahead.cost: calibrated once per model, device and dtype, then a
            keep rate learnt per request; with low acceptance, nothing). Our engine has
            its own `cost_aware` option.

    Example:
        >>> drafter = LookupDrafter(num_draft_tokens=3)
        >>> drafter.reset([1, 2, 3, 4, 1, 2])
        >>> drafter.propose().token_ids.tolist()
        [3, 4, 1]
    """

    def __init__(
        self,
        *,
        num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS,
        min_ngram: int = DEFAULT_MIN_NGRAM,
        max_ngram: int = DEFAULT_MAX_NGRAM,
        draft_factor: float = DEFAULT_DRAFT_FACTOR,
        memory: TokenStore | bool = True,
        documents: DocumentLibrary | None = None,
        eos_token_id: int | list[int] | None = None,
        cost_aware: bool = True,
    ):
        if not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be a positive int, got {num_draft_tokens!r}")
        if not isinstance(draft_factor, (int, float)) or not draft_factor > 0:
            raise ValueError(f"draft_factor must be a positive number, got {draft_factor!r}")
        if memory is True:
            memory = TokenStore(max_tokens=DEFAULT_MEMORY_TOKENS, min_ngram=min_ngram, max_ngram=max_ngram)
        elif memory is False:
            memory = None  # (not `memory or None`: an empty store is falsy)
        if memory is not None and not isinstance(memory, TokenStore):
            raise TypeError(f"memory must be a lookahead.TokenStore or a bool, got {type(memory).__name__}")
        if documents is not None and not isinstance(documents, DocumentLibrary):
            raise TypeError(f"documents must be a lookahead.DocumentLibrary, got {type(documents).__name__}")
        self.num_draft_tokens = num_draft_tokens
        self.draft_factor = float(draft_factor)
        self.cost_aware = bool(cost_aware)
        # Occurrences examined per draft, (of the suffix, of the suffix without its last token):
        # a chain needs the few best; a tree's extra branches come from the rest.
        self.chain_walk = (8, 4)
        self.tree_walk = (64, 16)
        self.index = TokenIndex(min_ngram=min_ngram, max_ngram=max_ngram)
        self.memory = memory
        self.documents = documents if documents is not None else DocumentLibrary()
        self._document_store: TokenStore | None = None  # the documents relevant to the current request
        self._trie = DraftTrie()  # rebuilt by every propose
        self.eos_option = _as_id_set(eos_token_id)  # as constructed; a generate call adds its own EOS
        self.eos_token_ids = self.eos_option
        self.stats = DraftStats()

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids no draft runs past; the verification loops set them per call."""
        return self._eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids: frozenset[int]) -> None:
        self._eos_token_ids = ids
        self._trie.eos = np.fromiter(sorted(ids), dtype=np.int64)

    @property
    def min_ngram(self) -> int:
        return self.index.min_ngram

    @property
    def max_ngram(self) -> int:
        return self.index.max_ngram

    def add_document(self, token_ids=None, *, text: str | None = None, tokenizer=None) -> None:
        """Makes a reference document available to drafts: token ids, or text with its tokenizer.

        Raises:
            ValueError: neither or both of token_ids and text, or text without a tokenizer.
        """
        if (token_ids is None) == (text is None):
            raise ValueError("add_document takes token_ids or text (with tokenizer=), exactly one")
        if text is not None:
            if tokenizer is None:
                raise ValueError("add_document(text=...) needs tokenizer= to turn the text into token ids")
            token_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        self.documents.add(token_ids)
        if len(self.index):  # mid-request: let the current request see it too
            self._document_store = self.documents.store_for(self.index.tokens, min_ngram=self.min_ngram, max_ngram=self.max_ngram)

    def reset(self, prompt_ids=()) -> None:
        """Starts a new request: files the old one into memory, forgets it and its stats, indexes `prompt_ids`."""
        if self.memory is not None and len(self.index):
            self.memory.add(self.index.tokens)
        self.index.clear()
        self.index.extend(prompt_ids)
        self._document_store = self.documents.store_for(self.index.tokens, min_ngram=self.min_ngram, max_ngram=self.max_ngram)
        self.stats = DraftStats()

    def extend(self, token_ids) -> None:
        """Appends verified tokens to the sequence."""
        self.index.extend(token_ids)

    def propose(self, max_tokens: int | None = None) -> Draft:
        """Drafts a chain of up to `max_tokens` (default num_draft_tokens) tokens.

        The chain is the heaviest path of the candidate trie (see `_fill_trie`): where
        candidates disagree, the continuation of longer and more frequent matches wins;
        among equals the request's own most recent occurrence. A draft anchored on an
        m-token match has at most ceil(draft_factor * m) tokens.
        Cost: O(walk * max_ngram) to find anchors, O(walk * max_tokens) to merge them.
        """
        limit = self._limit(max_tokens)
        if limit == 0:
            return EMPTY_DRAFT
        anchor = self._fill_trie(limit, *self.chain_walk)
        token_ids = self._trie.path(min(limit, math.ceil(self.draft_factor * anchor)))
        return Draft.chain(token_ids, anchor) if token_ids.shape[0] else EMPTY_DRAFT

    def propose_tree(self, max_tokens: int | None = None, *, max_nodes: int = 64) -> Draft:
        """Drafts a tree of at most `max_nodes` nodes, branches up to `max_tokens` deep.

        The nodes are the `max_nodes` heaviest of the candidate trie, each node's weight
        discounted by TREE_DEPTH_DECAY per level (without it, one long candidate takes
        every node before a branch of slightly lower weight gets one). Parents precede
        children; `propose`'s chain is the heaviest path (cut by draft_factor there, not here).
        """
        limit = self._limit(max_tokens)
        if limit == 0 or max_nodes < 1:
            return EMPTY_DRAFT
        anchor = self._fill_trie(limit, *self.tree_walk)
        token_ids, parents = self._trie.tree(max_nodes, TREE_DEPTH_DECAY)
        return Draft(token_ids, parents, anchor) if token_ids.shape[0] else EMPTY_DRAFT

    def _fill_trie(self, depth: int, walk: int, substitution_walk: int) -> int:
        """Rebuilds the candidate trie; returns the longest anchor (0: no candidate).

        Candidates are what followed, up to `depth` tokens:
        - each of the `walk` most recent occurrences of the current suffix in the request
          (and its longest match wherever it is), weighted MATCH_WEIGHT ** (match length);
        - substitutions: the `substitution_walk` most recent occurrences of the suffix
          without its last token (>= 2 tokens matched), continued one token later: the
          model replaced one token and goes on copying (an edited line, a paraphrased
          word). Weighted SUBSTITUTION_WEIGHT as much; where the last token is the one
          after that, the model skipped a token (a line break of reflowed text): continued
          after it, weighted SKIP_WEIGHT as much;
        - the stores' longest matches (documents, then memory), weighted STORE_WEIGHT as much.
        Ties between equal weights go to the earlier added: the most recent occurrence.
        """
        trie = self._trie
        trie.clear()
        anchor, substituted = trie.add_suffix_candidates(
            self.index, depth, walk=walk, substitution_walk=substitution_walk,
            match_weight=MATCH_WEIGHT, substitution_scale=SUBSTITUTION_WEIGHT, skip_scale=SKIP_WEIGHT,
        )
        if anchor < self.max_ngram - 1:  # else no store's match can outweigh it
            recent = self.index.tokens[-self.max_ngram :]  # the suffix a store matches (a view)
            for store in self._stores():
                if store is not None and len(store):
                    length = store.add_continuation(trie, recent, depth, match_weight=MATCH_WEIGHT, scale=STORE_WEIGHT)
                    anchor = max(anchor, length)
        return max(anchor, substituted) if len(trie) else 0

    def _limit(self, max_tokens: int | None) -> int:
        return max(0, self.num_draft_tokens if max_tokens is None else min(max_tokens, self.num_draft_tokens))

    def _stores(self):
        return (self._document_store, self.memory)


def _as_id_set(token_id) -> frozenset[int]:
    if token_id is None:
        return frozenset()
    if isinstance(token_id, (int, np.integer)):
        return frozenset([int(token_id)])
    if hasattr(token_id, "tolist"):
        token_id = token_id.tolist()
        if isinstance(token_id, int):
            return frozenset([token_id])
    ids = list(token_id)
    if not all(isinstance(t, (int, np.integer)) for t in ids):
        raise TypeError(f"eos_token_id must be an int or a list of ints, got {token_id!r}")
    return frozenset(int(t) for t in ids)
