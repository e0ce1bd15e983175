"""`LookupDrafter`: drafts the continuation of the current suffix from an index over seen tokens."""

import math
import threading
from contextlib import contextmanager

import numpy as np

from lookahead.documents import DocumentLibrary
from lookahead.draft import DEFAULT_MAX_TREE_NODES, EMPTY_DRAFT, Draft, DraftStats
from lookahead.errors import DrafterInUseError
from lookahead.index import DEFAULT_MAX_NGRAM, DEFAULT_MIN_NGRAM, TokenIndex, as_id_set, as_token_ids
from lookahead.policy import (  # (the candidates' weights and walks: one definition, shared with the engine's chains)
    CHAIN_WALK, FIRST_REACH, MATCH_BASE, SKIP_SCALE, STORE_SCALE, SUBSTITUTION_SCALE, TREE_WALK,
)
from lookahead.predictions import LeadChances, PredictionTable, RankChances, TreeChances
from lookahead.store import TokenStore
from lookahead.trie import NO_VOCAB_LIMIT, DraftTrie

# Defaults chosen by replaying ../shared/traces with `lookahead replay` (notes/design-provenance.md).
DEFAULT_NUM_DRAFT_TOKENS = 64  # a ceiling: the verification loops cut drafts to what pays on the hardware (cost_aware)
DEFAULT_DRAFT_FACTOR = 16.0  # a 1-token match drafts up to 16 tokens, 4 tokens up to 64; the loops cut by cost
TREE_DEPTH_DECAY = 0.9  # a tree node counts 10% less per level: the model may leave every candidate
# The model's own predictions (PredictionTable): a path of the table's best-first expansion from the
# last token weighs PREDICTION_SCALE * its probability (RankChances) * w / c, where lookup's heaviest
# first token weighs w and is the model's next token with chance c (LeadChances, per match length):
# both sources on one scale of probability, so the table leads where lookup's candidates are short,
# disagree or are absent (weight 1 then), and a long match that keeps holding leads with its chain.
PREDICTION_SCALE = 2.0  # chosen over 0.5 and 1 on stories260K's unsized trees (notes/README.md: predictions scale)
# Best-first paths of the table a draft takes. A plain chain (propose without hedged) takes none:
# it has no room for the table's siblings, so its tokens per step are lookup's alone
# (notes/README.md: blended chains).
PREDICTION_CHAIN_NODES = 0
PREDICTION_TREE_NODES = 64  # and a tree's
# A drafter kept across requests starts each from its last ones' rank and lead chances at this share of
# their counts (the request's own soon outweigh them): on stories260K's kept drafter at a GPU-like
# step cost, 1.02x tokens per step greedy and 1.03x sampled over starting afresh (notes/README.md: trees at a GPU's prices).
CARRY = 0.5
# Sized, the chain is lookup's heaviest path whenever lookup has one (its keep rate, learnt per
# match length, prices it). A one-row tree step (propose(hedged=True), likeliest_tree) verifies
# the candidates the model likeliest writes, each priced from that keep rate and the blend's
# weights and corrected by what such nodes kept (TreeChances), as many as pay under the step's cost;
# a batch's tree (grow_tree) takes lookup's heaviest nodes before any of the table's alone, as
# many as cost what the widest chain does (notes/README.md: lookup first; trees at a GPU's prices).
# Unsized (propose_tree) the blend is by weight, where the table's siblings pay.
_ADAPTER_LOCK = threading.Lock()
_IN_USE = ("this LookupDrafter is serving a request in another thread. Use one drafter per thread; "
           "to let them learn from each other, give them one TokenStore: LookupDrafter(memory=store)")

class _NotAnInstanceError(TypeError, AttributeError):
    """An instance attribute read on the class (an AttributeError too, so hasattr and inspect see no attribute)."""


class _AdapterAttribute:
    """A name transformers reads on an assistant_model, answered by the drafter's TransformersAssistant."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, drafter, owner=None):
        if drafter is None:
            raise _NotAnInstanceError(
                f"{owner.__name__}.{self.name} was read on the class: pass a drafter instance, "
                f"assistant_model={owner.__name__}(), not the class {owner.__name__}"
            )
        return getattr(drafter.transformers_assistant(), self.name)


class LookupDrafter:
    """Drafts what followed the current suffix where it occurred before.

    Pass it to transformers as `model.generate(**inputs, assistant_model=LookupDrafter())`:
    outputs are token for token those of `model.generate(**inputs)` (greedy) or sampled
    from the same distribution (`do_sample=True`). It indexes the prompt and every
    verified token, never rejected drafts; it can also copy from reference documents
    (`add_document`) and from what earlier requests wrote (`memory`).

    Each draft merges the continuations of many earlier occurrences into a weighted trie
    (`_fill_trie`): longer matches weigh more, agreeing occurrences add up, and after a
    token the model replaced, copying resumes where it left off. What the model copies
    from its prompt it copies from where the text first appeared there; what it repeats
    of its own output, from where it last wrote it. A chain is the trie's heaviest path,
    a tree its heaviest nodes.

    Lifecycle (lookahead.draft.DraftSource, what a request and the loops call):
    `reset(prompt_ids)`, then per step `propose(num_draft_tokens)` (or `propose_tree`) and
    `extend(verified_ids)`; `finish()` files the request into memory. `stats` describe the
    current request, or the last finished one until the next `reset`. The drafter needs
    numpy and numba only; what transformers reads on an `assistant_model` is answered by
    `lookahead.integrations.assistant`, imported on first use.

    One drafter serves one request at a time, in the thread that started it (`reset`):
    `extend`/`propose` from another thread, and a second request while a loop holds the
    drafter (`exclusive`), raise DrafterInUseError. Threads that generate concurrently
    each need their own drafter; they can share a `TokenStore` as memory.

    Args:
        num_draft_tokens: most tokens proposed per step (per branch, for trees).
        min_ngram: shortest suffix that may anchor a draft.
        max_ngram: longest suffix tried; longer matches are preferred.
        draft_factor: a draft anchored on an m-token match has at most ceil(draft_factor * m)
            tokens. The default caps only drafts anchored on 1-3 tokens: which drafted
            tokens are worth verifying depends on the hardware, and the loops decide that
            (cost_aware).
        memory: what earlier requests wrote: True (default) for a private TokenStore (its
            default size), a TokenStore to share one between drafters (and
            threads), False for none. Each request's prompt and output are added to it when
            the next request starts; its continuations weigh as much as the request's
            own for a match one token shorter.
        documents: a DocumentLibrary of reference documents (an empty private one if not
            given; see add_document). Each request consults those sharing text with its
            prompt. Weighed like memory; preferred to it on ties.
        eos_token_id: token id(s) a draft never runs past (transformers' loop sets it
            from the generation config).
        vocab_size: the model's vocabulary size, if known up front (the verification loops
            set it from the model). Drafts stop before any id at or above it, wherever it
            comes from (documents, a shared memory written for another model), and
            add_document refuses such ids.
        cost_aware: let the verification loop (transformers' or ours) cut each draft to
            what verifying it pays for on the target (lookahead.sizing: block costs
            calibrated once per model, device and dtype, then learnt from the loop's own
            steps; a keep rate learnt per request; with low acceptance, nothing). False:
            every draft is verified whole.
        predictions: draft from the model's own predictions too: `lookahead.generate` records
            the model's top-k next tokens at every position each step verifies (rejected
            draft nodes included) into a PredictionTable, and drafts merge the table's likeliest
            continuations of the last token with lookup's (see PREDICTION_SCALE). True (default)
            for a private table, a PredictionTable to share one between drafters (and threads)
            of one model, False for none (lookup alone). transformers' `assistant_model=` loop
            and vLLM give a drafter no logits: there the table stays as it is (empty, unless shared).

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
        vocab_size: int | None = None,
        cost_aware: bool = True,
        predictions: PredictionTable | bool = True,
    ):
        if not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be a positive int, got {num_draft_tokens!r}")
        if not isinstance(draft_factor, (int, float)) or not draft_factor > 0:
            raise ValueError(f"draft_factor must be a positive number, got {draft_factor!r}")
        if memory is True:
            memory = TokenStore(min_ngram=min_ngram, max_ngram=max_ngram)
        elif memory is False:
            memory = None  # (not `memory or None`: an empty store is falsy)
        if memory is not None and not isinstance(memory, TokenStore):
            raise TypeError(f"memory must be a lookahead.TokenStore or a bool, got {type(memory).__name__}")
        if documents is not None and not isinstance(documents, DocumentLibrary):
            raise TypeError(f"documents must be a lookahead.DocumentLibrary, got {type(documents).__name__}")
        if predictions is True:
            predictions = PredictionTable()
        elif predictions is False:
            predictions = None
        if predictions is not None and not isinstance(predictions, PredictionTable):
            raise TypeError(f"predictions must be a lookahead.PredictionTable or a bool, got {type(predictions).__name__}")
        self.num_draft_tokens = num_draft_tokens
        self.draft_factor = float(draft_factor)
        self.cost_aware = bool(cost_aware)
        self.chain_walk, self.tree_walk, self.first_reach = CHAIN_WALK, TREE_WALK, FIRST_REACH
        self._prompt_len = 0  # the current request's prompt: index.tokens[:_prompt_len]
        self.index = TokenIndex(min_ngram=min_ngram, max_ngram=max_ngram)
        self.memory = memory
        self.documents = documents if documents is not None else DocumentLibrary()
        self._document_store: TokenStore | None = None  # the documents relevant to the current request
        self.predictions = predictions
        self.lookup = True  # False: draft from the prediction table alone (a measurement's baseline)
        self.rank_chances = RankChances(predictions.k) if predictions is not None else None  # learnt, carried across requests (reset)
        self.lead_chances = LeadChances(max_ngram)  # learnt, carried across requests (reset)
        self.tree_chances = TreeChances()  # learnt across requests (likeliest_tree)
        self._read_table = predictions is not None  # the last draft read the table: extend counts ranks (until a plain chain)
        self._trie = DraftTrie()  # rebuilt by every propose
        self._lookup_nodes = 1  # trie nodes below this (the root included) hold lookup's candidates
        self._tree_match_len: int | None = None  # the trie holds a tree's candidates (grow_tree), anchored this long
        self.eos_option = as_id_set(eos_token_id)  # as constructed; a generate call adds its own EOS
        self.eos_token_ids = self.eos_option
        self.vocab_size = vocab_size
        self.stats = DraftStats()
        self._transformers_adapter = None  # built on first use by transformers' loop
        self._owner: int | None = None  # threading.get_ident() of the thread whose request this is (set by reset)
        self._held = threading.RLock()  # held by a verification loop while it drafts (exclusive)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids no draft runs past; the verification loops set them per call."""
        return self._eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids: frozenset[int]) -> None:
        self._eos_token_ids = ids
        self._trie.eos = np.fromiter(sorted(ids), dtype=np.int64)

    @property
    def vocab_size(self) -> int | None:
        """The model's vocabulary size (None: unknown); no draft holds an id at or above it."""
        return self._vocab_size

    @vocab_size.setter
    def vocab_size(self, size: int | None) -> None:
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise ValueError(f"vocab_size must be a positive int or None, got {size!r}")
        self._vocab_size = size
        self._trie.vocab_limit = NO_VOCAB_LIMIT if size is None else size

    def sibling(self) -> "LookupDrafter":
        """A new drafter with this one's options, sharing its memory and documents: one per row of a batch.

        Example:
            >>> parent = LookupDrafter(num_draft_tokens=3)
            >>> row = parent.sibling()
            >>> row.memory is parent.memory and row.documents is parent.documents and row.predictions is parent.predictions
            True
        """
        child = LookupDrafter(
            num_draft_tokens=self.num_draft_tokens, min_ngram=self.min_ngram, max_ngram=self.max_ngram,
            draft_factor=self.draft_factor, memory=self.memory if self.memory is not None else False,
            documents=self.documents, eos_token_id=sorted(self.eos_option), vocab_size=self.vocab_size, cost_aware=self.cost_aware,
            predictions=self.predictions if self.predictions is not None else False,
        )
        child.chain_walk, child.tree_walk, child.first_reach, child.lookup = self.chain_walk, self.tree_walk, self.first_reach, self.lookup
        child.eos_token_ids = self.eos_token_ids
        child.tree_chances = self.tree_chances
        return child

    @property
    def min_ngram(self) -> int:
        return self.index.min_ngram

    @property
    def max_ngram(self) -> int:
        return self.index.max_ngram

    def add_document(self, token_ids=None, *, text: str | None = None, tokenizer=None) -> None:
        """Makes a reference document available to drafts: token ids, or text with its tokenizer.

        Raises:
            ValueError: neither or both of token_ids and text, text without a tokenizer, or
                an id at or above vocab_size (where known: set it, or generate once).
            TypeError: token_ids not a 1-D sequence of ints.
        """
        if (token_ids is None) == (text is None):
            raise ValueError("add_document takes token_ids or text (with tokenizer=), exactly one")
        if text is not None:
            if tokenizer is None:
                raise ValueError("add_document(text=...) needs tokenizer= to turn the text into token ids")
            token_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        token_ids = as_token_ids(token_ids, name="document token ids")
        if self.vocab_size is not None and token_ids.size and int(token_ids.max()) >= self.vocab_size:
            bad = int(np.argmax(token_ids >= self.vocab_size))
            raise ValueError(f"document token id {int(token_ids[bad])} at position {bad} is outside the model's vocabulary "
                             f"(vocab_size={self.vocab_size}): was the document tokenized for another model?")
        self.documents.add(token_ids)
        if len(self.index):  # mid-request: let the current request see it too
            self._document_store = self.documents.store_for(self.index.tokens, min_ngram=self.min_ngram, max_ngram=self.max_ngram)

    @contextmanager
    def exclusive(self):
        """Holds the drafter for a verification loop (a step of transformers', a whole call of ours).

        Raises DrafterInUseError at once, without waiting, if another thread holds it; the
        holder's own calls (reset, propose, extend) nest inside.
        """
        if not self._held.acquire(blocking=False):
            raise DrafterInUseError(_IN_USE)
        try:
            yield self
        finally:
            self._held.release()

    def reset(self, prompt_ids=()) -> None:
        """Starts a new request, in this thread: finishes the old one (`finish`), indexes `prompt_ids`, starts `stats` afresh.

        Raises:
            DrafterInUseError: a verification loop in another thread holds the drafter.
        """
        with self.exclusive():
            self.finish()
            self.index.extend(prompt_ids)
            self._prompt_len = len(self.index)
            self._document_store = self.documents.store_for(self.index.tokens, min_ngram=self.min_ngram, max_ngram=self.max_ngram)
            self.stats = DraftStats()
            if self.predictions is not None:  # the table is kept: so is, at a share, what it taught of it
                self.rank_chances.carry(CARRY)
                self.lead_chances.carry(CARRY)

    def finish(self) -> None:
        """Ends the current request, in this thread: files its tokens (prompt and output) into memory and drops them.

        `stats` still describe the finished request until the next `reset`. The drafter stays this
        thread's: a loop in another thread still driving the request gets DrafterInUseError at its
        next call rather than drafting on from nothing. With no tokens it files nothing.

        Raises:
            DrafterInUseError: a verification loop in another thread holds the drafter.
        """
        with self.exclusive():
            if self.memory is not None and len(self.index):
                self.memory.add(self.index.tokens)
            self.index.clear()
            self._tree_match_len = None
            self._owner = threading.get_ident()
            self._prompt_len = 0
            self._document_store = None

    @property
    def num_tokens(self) -> int:
        """Tokens of the current request seen so far: its prompt and what `extend` added."""
        return len(self.index)

    @property
    def tokens(self) -> np.ndarray:
        """(num_tokens,) those tokens: a read-only view of the index, stale after the next extend, reset or finish."""
        return self.index.tokens

    def extend(self, token_ids) -> None:
        """Appends verified tokens to the sequence (DrafterInUseError from a thread other than reset's).

        With predictions, after a draft that read the table, each token counts at the rank the table's
        row for the token before it held it (before the step that wrote them records its own
        predictions: record_predictions); after a plain chain, which reads none, nothing is counted.
        """
        self._check_thread()
        self._tree_match_len = None
        start = len(self.index)
        self.index.extend(token_ids)
        if self._read_table and start:
            self.rank_chances.observe(self.predictions, self.index.tokens, start)
        if self.lead_chances.pending is not None and len(self.index) > start:  # resolves lookup's first token of a tree draft
            self.lead_chances.written(int(self.index.tokens[start]))

    def reads_predictions(self, *, tree: bool) -> bool:
        """Whether drafts of this kind (trees, or plain chains) read the prediction table: a loop that
        drafts only chains need not compute the model's top-k for it (PREDICTION_CHAIN_NODES is 0)."""
        return self.predictions is not None and (tree or PREDICTION_CHAIN_NODES > 0)

    def record_predictions(self, inputs, predicted) -> None:
        """The model's likeliest next tokens after each of `inputs` (block entries of a verified step):
        (n,) ids and (n, k) ids, likeliest first. Call after `extend` with the step's tokens."""
        if self.predictions is not None:
            self.predictions.record(inputs, predicted)

    def _check_thread(self) -> None:
        owner = self._owner
        if owner is not None and owner != threading.get_ident():
            raise DrafterInUseError(_IN_USE)

    def propose(self, num_draft_tokens: int | None = None, *, hedged: bool = False) -> Draft:
        """Drafts a chain of up to `num_draft_tokens` tokens (at most, and by default, the drafter's own).

        The chain is the heaviest path of the candidate trie (see `_fill_trie`): where
        the longest match occurs only in the prompt, what followed its first occurrence
        there (unless a document or memory matches 2+ tokens longer); otherwise, where
        candidates disagree, the continuation of longer and more frequent matches wins,
        among equals the request's own most recent occurrence. A draft anchored on an
        match_len-token match has at most ceil(draft_factor * match_len) tokens.
        With `hedged`, the candidates are a tree's (propose_tree's: more occurrences
        walked, the prompt's first occurrence beside the rest) and the chain is their
        heaviest path; `grow_tree` then drafts the tree from them without searching again,
        so a tree step searches once. (Replayed on the dev traces under a CPU's cost
        curves, trees sized from the hedged chain do as well as from the plain one: modelled
        speedups within 0.5%.)
        Cost: O(walk * max_ngram) to find anchors, O(walk * num_draft_tokens) to merge them,
        O(first_reach * max_ngram) to find a first occurrence.
        """
        self._check_thread()
        self._tree_match_len = None
        limit = self._limit(num_draft_tokens)
        if limit == 0:
            if hedged:  # no room: no candidates to grow a tree from
                self._trie.clear()
                self._tree_match_len = 0
            return EMPTY_DRAFT
        match_len = self._fill_trie(limit, *(self.tree_walk if hedged else self.chain_walk), first_only=not hedged,
                                    predicted=PREDICTION_TREE_NODES if hedged else PREDICTION_CHAIN_NODES)
        if hedged:
            self._tree_match_len = match_len
        nodes = self._trie.path_nodes(limit, first_class=self._lookup_nodes)
        if nodes.shape[0] and nodes[0] >= self._lookup_nodes:  # the table leads (lookup has no candidate): anchored on no match
            match_len = 0
        else:
            nodes = nodes[: math.ceil(self.draft_factor * match_len)]
        return Draft.chain(self._trie.path_tokens(nodes), match_len) if nodes.shape[0] else EMPTY_DRAFT

    def propose_tree(self, num_draft_tokens: int | None = None, *, max_tree_nodes: int = DEFAULT_MAX_TREE_NODES) -> Draft:
        """Drafts a tree of at most `max_tree_nodes` nodes, branches up to `num_draft_tokens` deep.

        The nodes are the `max_tree_nodes` heaviest of the candidate trie, each node's weight
        discounted by TREE_DEPTH_DECAY per level (without it, one long candidate takes
        every node before a branch of slightly lower weight gets one). Parents precede
        children; `propose`'s chain is the heaviest path (cut by draft_factor there, not here).
        """
        self._check_thread()
        self._tree_match_len = None
        limit = self._limit(num_draft_tokens)
        if limit == 0 or max_tree_nodes < 1:
            return EMPTY_DRAFT
        self._tree_match_len = self._fill_trie(limit, *self.tree_walk, first_only=False, predicted=PREDICTION_TREE_NODES)
        return self._tree(max_tree_nodes, first_class=0)  # whole: blended by weight

    def grow_tree(self, max_tree_nodes: int) -> Draft:
        """A tree of the `max_tree_nodes` heaviest candidates of the last `propose(..., hedged=True)` (or `propose_tree`),
        lookup's before the prediction table's alone (a sized step's tree: see PREDICTION_TREE_NODES).

        Raises:
            RuntimeError: no tree's candidates were searched since the sequence last changed.
        """
        self._searched("grow_tree")
        return self._tree(max_tree_nodes, first_class=self._lookup_nodes)  # sized: lookup's nodes first

    def likeliest_tree(self, max_tree_nodes: int, keep_chance: float) -> tuple[Draft, np.ndarray, tuple]:
        """The `max_tree_nodes` candidates of the last `propose(..., hedged=True)` (or `propose_tree`) the model
        likeliest writes, likeliest first, each one's chance, and what `tree_chances.observe` learns from once they
        are verified: (estimates, which are the table's). A node's chance is its estimate (DraftTrie.likeliest:
        lookup's heaviest next token kept with `keep_chance`, its siblings in proportion to their weight) corrected
        by what such nodes kept (TreeChances). Every prefix of the draft is a tree, so a sizer cuts it where the
        next node no longer pays (sizing.rules.tree_size).

        Raises:
            RuntimeError: no tree's candidates were searched since the sequence last changed.
        """
        self._searched("likeliest_tree")
        token_ids, parents, chances, estimates, table = self._trie.likeliest(
            max_tree_nodes, keep_chance, self.tree_chances.correction(self._lookup_nodes))
        return Draft(token_ids, parents, self._tree_match_len), chances, (estimates, table)

    def _searched(self, caller: str) -> None:
        self._check_thread()
        if self._tree_match_len is None:
            raise RuntimeError(f"{caller} drafts from the last propose(..., hedged=True) or propose_tree, and there is none since "
                               "the sequence changed")

    def _tree(self, max_tree_nodes: int, *, first_class: int) -> Draft:
        if max_tree_nodes < 1 or not len(self._trie):
            return EMPTY_DRAFT
        token_ids, parents = self._trie.tree(max_tree_nodes, TREE_DEPTH_DECAY, first_class=first_class)
        return Draft(token_ids, parents, self._tree_match_len) if token_ids.shape[0] else EMPTY_DRAFT

    def _fill_trie(self, num_draft_tokens: int, walk: int, substitution_walk: int, *, first_only: bool, predicted: int) -> int:
        """Rebuilds the candidate trie; returns the longest match_len anchoring a lookup candidate (0: none).

        Candidates are what followed, up to `num_draft_tokens` tokens:
        - where the longest match occurs only in the prompt (the model is copying it),
          its first occurrence there (found among the `first_reach` most recent
          occurrences of the last token), weighted MATCH_BASE ** match_len, added
          first. A summary restates a sentence, a name's first full mention, an edit
          rewrites a line, from where the prompt introduced them (transformers' prompt
          lookup always drafts from a first occurrence). With `first_only` (chains) it is
          the request's only candidate then, and competes with the stores' alone; a tree
          hedges with all of the below too. The model's own text it repeats from where it
          last wrote it, hence:
        - each of the `walk` most recent occurrences of the current suffix in the request
          (and its longest match wherever it is), weighted MATCH_BASE ** match_len;
        - substitutions: the `substitution_walk` most recent occurrences of the suffix
          without its last token (>= 2 tokens matched), continued one token later: the
          model replaced one token and goes on copying (an edited line, a paraphrased
          word). Weighted SUBSTITUTION_SCALE as much; where the last token is the one
          after that, the model skipped a token (a line break of reflowed text): continued
          after it, weighted SKIP_SCALE as much;
        - the stores' longest matches (documents, then memory), weighted STORE_SCALE as much;
        - with predictions, the `predicted` likeliest paths of the table from the last token
          (trie.add_predictions), each weighing PREDICTION_SCALE * its probability under the
          request's rank chances, on lookup's scale (w / c: lookup's heaviest first token's
          weight over its keep chance at this match length; 1 without lookup candidates).
        Ties between equal weights go to the earlier added: the prompt's first occurrence,
        then the most recent, then the table.
        """
        trie = self._trie
        trie.clear()
        match_len = substituted = 0
        if self.lookup:
            match_len, substituted = trie.add_suffix_candidates(
                self.index.buffers(), num_draft_tokens, walk=walk, substitution_walk=substitution_walk,
                match_base=MATCH_BASE, substitution_scale=SUBSTITUTION_SCALE, skip_scale=SKIP_SCALE,
                source_len=self._prompt_len, first_reach=self.first_reach, first_only=first_only,
            )
            if match_len < self.max_ngram - 1:  # else no store's match can outweigh it
                recent = self.index.tokens[-self.max_ngram :]  # the suffix a store matches (a view)
                for store in (self._document_store, self.memory):
                    if store is not None and len(store):
                        store_len = store.add_continuation(trie, recent, num_draft_tokens, match_base=MATCH_BASE, scale=STORE_SCALE)
                        match_len = max(match_len, store_len)
        looked_up = max(match_len, substituted) if len(trie) else 0
        self._lookup_nodes = len(trie) + 1
        self._read_table = self.predictions is not None and predicted > 0 and len(self.index) > 0
        if self._read_table:  # (a plain chain takes none of the table, PREDICTION_CHAIN_NODES: nor pays for its scale)
            scale = PREDICTION_SCALE
            if len(trie):  # lookup's heaviest first token weighs w and is kept with chance c: a probability p weighs p * w / c
                token, w = trie.heaviest_first()
                scale *= w / self.lead_chances.chance(looked_up)
                self.lead_chances.drafted(looked_up, token)
            trie.add_predictions(self.predictions.ids, int(self.index.tokens[-1]), self.rank_chances.chances(),
                                 budget=predicted, max_depth=num_draft_tokens, scale=scale)
        return looked_up

    def _limit(self, num_draft_tokens: int | None) -> int:
        return max(0, self.num_draft_tokens if num_draft_tokens is None else min(num_draft_tokens, self.num_draft_tokens))

    # -- transformers' assistant_model protocol ----------------------------------------------
    # transformers' generate() treats an assistant_model as a model and reads these five
    # names. One adapter per drafter answers them and owns that loop's per-request state;
    # it lives in lookahead.integrations.assistant, imported here on first use, so the
    # drafting core never imports torch or transformers. Note: transformers reads `config`
    # and `device` while it validates the call, and the adapter checks the call there
    # (see TransformersAssistant.config). Read on the class (assistant_model=LookupDrafter,
    # the parentheses forgotten) they raise a TypeError that says so.

    config = _AdapterAttribute()
    device = _AdapterAttribute()
    generation_config = _AdapterAttribute()

    def _supports_logits_to_keep(self) -> bool:
        return False

    def generate(self, input_ids, **kwargs):
        """transformers' candidate generator calls this once per verify step (not a model's generate)."""
        return self.transformers_assistant().generate(input_ids, **kwargs)

    def transformers_assistant(self):
        """The TransformersAssistant that answers transformers' reads on this drafter and owns that loop's state.

        Built on first use (which imports lookahead.integrations.assistant), one per drafter.
        """
        if self._transformers_adapter is None:
            from lookahead.integrations.assistant import TransformersAssistant

            with _ADAPTER_LOCK:  # one adapter per drafter, even when two threads first call at once
                if self._transformers_adapter is None:
                    self._transformers_adapter = TransformersAssistant(self)
        return self._transformers_adapter
