"""`LookupDrafter`: drafts the continuation of the current suffix from an index over seen tokens."""

import threading
from contextlib import contextmanager, nullcontext

import numpy as np

from lookahead.documents import DocumentLibrary
from lookahead.draft import DEFAULT_MAX_TREE_NODES, EMPTY_DRAFT, Draft, DraftStats
from lookahead.engine.chain import NO_STORE, add_lookup_candidates, draft_chain, lookup_nodes
from lookahead.engine.groups import lookup_group, stores_group, work_group
from lookahead.engine.trees import hedged_chain
from lookahead.errors import DrafterInUseError
from lookahead.index import DEFAULT_MAX_NGRAM, DEFAULT_MIN_NGRAM, TokenIndex, as_id_set, as_token_ids
from lookahead.index.kernels import MAX_NGRAM
from lookahead.policy import (CHAIN_WALK, FIRST_REACH, PREDICTION_CHAIN_NODES, PREDICTION_TREE_NODES,
                              TREE_DEPTH_DECAY, TREE_WALK)  # shared with the engine's rows
from lookahead.predictions import NO_TABLE, LeadChances, PredictionTable, RankChances, TreeChances
from lookahead.store import TokenStore
from lookahead.trie import NO_VOCAB_LIMIT, DraftTrie

# Defaults chosen by replaying ../shared/traces with `lookahead replay` (notes/design-provenance.md).
DEFAULT_NUM_DRAFT_TOKENS = 64  # a ceiling: the verification loops cut drafts to what pays on the hardware (cost_aware)
DEFAULT_DRAFT_FACTOR = 16.0  # a 1-token match drafts up to 16 tokens, 4 tokens up to 64; the loops cut by cost
# A drafter kept across requests starts each from its last ones' rank and lead chances at this share of
# their counts (the request's own soon outweigh them): on stories260K's kept drafter at a GPU-like
# step cost, 1.02x tokens per step greedy and 1.03x sampled over starting afresh (notes/README.md: trees at a GPU's prices).
CARRY = 0.5
# Sized, the chain is lookup's heaviest path whenever lookup has one (its keep rate, learnt per
# match length, prices it). A one-row tree step (propose(hedged=True), _likeliest_tree) verifies
# the candidates the model likeliest writes, each priced from that keep rate and the blend's
# weights and corrected by what such nodes kept (TreeChances), as many as pay under the step's cost;
# a batch's tree (_grow_tree) takes lookup's heaviest nodes before any of the table's alone, as
# many as cost what the widest chain does (notes/README.md: lookup first; trees at a GPU's prices).
# Unsized (propose_tree) the blend is by weight, where the table's siblings pay.
NO_RANKS = np.zeros(0)  # hedged_chain's rank counts and prior where the drafter has no table
_ADAPTER_LOCK = threading.Lock()
_IN_USE = ("this LookupDrafter is serving a request in another thread. Use one drafter per thread; "
           "to let them learn from each other, give them one TokenStore: LookupDrafter(memory=store)")

# What transformers' assisted loop reads or calls on an `assistant_model`; answered by the drafter's
# TransformersAssistant (lookahead.integrations.assistant, imported on first use: the core stays torch-free).
_ADAPTER_NAMES = frozenset({"config", "device", "generation_config", "generate"})


class _DrafterType(type):
    """LookupDrafter's metaclass: an adapter name read on the class (assistant_model=LookupDrafter, the
    parentheses forgotten) raises a TypeError that says so; a TypeError and an AttributeError, so hasattr and
    inspect see no attribute."""

    def __getattr__(cls, name):
        if name in _ADAPTER_NAMES:
            raise _NotAnInstanceError(
                f"{cls.__name__}.{name} was read on the class: pass a drafter instance, "
                f"assistant_model={cls.__name__}(), not the class {cls.__name__}"
            )
        raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r}")


class _NotAnInstanceError(TypeError, AttributeError):
    """An instance attribute read on the class."""


class LookupDrafter(metaclass=_DrafterType):
    """Drafts what followed the current text where it occurred before; the model verifies every draft.

    Most users pass it to transformers, `model.generate(**inputs, assistant_model=LookupDrafter())`:
    greedy outputs are token for token those of `model.generate(**inputs)`, sampled ones come
    from the same distribution. For batches and tree drafts, `lookahead.generate(model,
    input_ids, attention_mask=..., drafter=LookupDrafter())`. Drafts come from the prompt, the
    output so far, reference documents (`add_document`), what earlier requests wrote (`memory`)
    and, in `lookahead.generate`, the model's own predictions. After a call, `print(drafter.stats)`
    says how many tokens each source drafted and had kept and why steps drafted nothing;
    `drafter.stats.render(tokenizer, html="drafts.html")` shows where each kept token came from.

    One drafter serves one request at a time, in the thread that started it: threads that
    generate concurrently each need their own (DrafterInUseError otherwise); they can share a
    TokenStore as memory. Save what it learnt with `drafter.memory.save(path)` and
    `drafter.documents.save(path)`; start from it with `LookupDrafter(memory=TokenStore.load(path),
    documents=DocumentLibrary.load(path))`.

    Args:
        num_draft_tokens: most tokens drafted per step (a ceiling: cost_aware cuts below it).
        min_ngram, max_ngram: shortest and longest suffix of the text a draft is anchored on.
        draft_factor: a draft anchored on an m-token match has at most ceil(draft_factor * m) tokens.
        memory: True (default) for a private TokenStore of what earlier requests wrote, a
            TokenStore to share one between drafters, False for none.
        documents: a DocumentLibrary of reference documents (default: an empty one; see add_document).
        eos_token_id: token id(s) a draft never runs past (generate adds the model's).
        vocab_size: the model's vocabulary size, if known (generate sets it): drafts hold no id above it.
        cost_aware: cut each draft to what verifying it pays for on this hardware. The cost of a
            wider forward pass is learnt from the call's own steps (nothing is timed up front;
            `lookahead.verify_costs(model)` times it ahead if you prefer) and the chance a draft is
            kept from the request's own steps; where drafts are rarely kept or verifying more
            costs more than it saves, a step drafts nothing. False: every draft is verified whole.
        predictions: also draft from the model's own predictions, recorded each step by
            `lookahead.generate` (transformers' `assistant_model=` loop gives no logits: there
            they stay empty). True (default) for a private PredictionTable, a PredictionTable to
            share one between drafters of one model, False for none.

    Example:
        >>> drafter = LookupDrafter(num_draft_tokens=3)
        >>> drafter.reset([1, 2, 3, 4, 1, 2])  # what a loop calls: reset, then propose and extend per step
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
        self.tree_chances = TreeChances()  # learnt across requests (_likeliest_tree)
        self._read_table = predictions is not None  # the last draft read the table: extend counts ranks (until a plain chain)
        self._trie = DraftTrie()  # rebuilt by every propose
        self._chain_ids = np.zeros(num_draft_tokens, dtype=np.int64)  # (num_draft_tokens,) a chain's path: nodes, then ids
        self._chain_origins = np.zeros(num_draft_tokens, dtype=np.int8)  # (num_draft_tokens,) its tokens' sources
        self._path = np.zeros(num_draft_tokens, dtype=np.int64)  # (num_draft_tokens,) hedged_chain's scratch
        self._rank_scratch = np.zeros(predictions.k if predictions is not None else 0)  # (k,) the rank chances, hedged_chain's
        self._ends = np.zeros(MAX_NGRAM + 1, dtype=np.int64)  # (MAX_NGRAM + 1,) engine.chain's scratch: match_ends'
        self._scratch = np.zeros(3, dtype=np.int64)  # (3,) and its results (engine.groups' work group)
        self._lookup_nodes = 1  # trie nodes below this (the root included) hold lookup's candidates
        self._tree_match_len: int | None = None  # the trie holds a tree's candidates (_grow_tree), anchored this long
        self.eos_option = as_id_set(eos_token_id)  # as constructed; a generate call adds its own EOS
        self.eos_token_ids = self.eos_option
        self.vocab_size = vocab_size
        self.stats = DraftStats()
        self._transformers_adapter = None  # built on first use by transformers' loop
        self._owner: int | None = None  # threading.get_ident() of the thread whose request this is (set by reset)
        self._held = threading.RLock()  # held by a verification loop while it drafts (_exclusive)

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
    def _exclusive(self):
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
        """Starts a new request on `prompt_ids`, in this thread (finishing the last one); `stats` start afresh.

        Raises DrafterInUseError where a verification loop in another thread holds the drafter.
        """
        with self._exclusive():
            self.finish()
            self.index.extend(prompt_ids)
            self._prompt_len = len(self.index)
            self._document_store = self.documents.store_for(self.index.tokens, min_ngram=self.min_ngram, max_ngram=self.max_ngram)
            self.stats = DraftStats()
            if self.predictions is not None:  # the table is kept: so is, at a share, what it taught of it
                self.rank_chances.carry(CARRY)
                self.lead_chances.carry(CARRY)

    def finish(self) -> None:
        """Ends the current request: files its prompt and output into memory and drops them; `stats` stay.

        Raises DrafterInUseError where a verification loop in another thread holds the drafter.
        """
        # The drafter stays this thread's: a loop in another thread still driving the request gets
        # DrafterInUseError at its next call rather than drafting on from nothing. No tokens: nothing filed.
        with self._exclusive():
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
        """Appends verified tokens to the sequence (DrafterInUseError from a thread other than reset's)."""
        # With predictions, after a draft that read the table, each token counts at the rank the table's
        # row for the token before it held it (before the step that wrote them records its own
        # predictions: _record_predictions); after a plain chain, which reads none, nothing is counted.
        self._check_thread()
        self._tree_match_len = None
        start = len(self.index)
        self.index.extend(token_ids)
        if self._read_table and start:
            self.rank_chances.observe(self.predictions, self.index.tokens, start)
        if self.lead_chances.pending is not None and len(self.index) > start:  # resolves lookup's first token of a tree draft
            self.lead_chances.written(int(self.index.tokens[start]))

    def _reads_predictions(self, *, tree: bool) -> bool:
        """Whether drafts of this kind (trees, or plain chains) read the prediction table: a loop that
        drafts only chains need not compute the model's top-k for it (PREDICTION_CHAIN_NODES is 0)."""
        return self.predictions is not None and (tree or PREDICTION_CHAIN_NODES > 0)

    def _record_predictions(self, inputs, predicted) -> None:
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

        Anchored on an m-token match, at most ceil(draft_factor * m) tokens. `hedged`: from a tree's
        candidates (propose_tree's), so that a tree step searches once.
        """
        # The chain is the heaviest path of the candidate trie (see `_fill_trie`; engine.chain.draft_chain
        # drafts a plain one in one kernel call, the same kernel the engine's rows call): where
        # the longest match occurs only in the prompt, what followed its first occurrence
        # there (unless a document or memory matches 2+ tokens longer); otherwise, where
        # candidates disagree, the continuation of longer and more frequent matches wins,
        # among equals the request's own most recent occurrence. With `hedged`, the candidates are a
        # tree's (propose_tree's: more occurrences walked, the prompt's first occurrence beside the rest)
        # and the chain is their heaviest path; `_grow_tree` then drafts the tree from them without
        # searching again. (Replayed on the dev traces under a CPU's cost curves, trees sized from the
        # hedged chain do as well as from the plain one: modelled speedups within 0.5%.)
        # Cost: O(walk * max_ngram) to find anchors, O(walk * num_draft_tokens) to merge them,
        # O(first_reach * max_ngram) to find a first occurrence.
        self._check_thread()
        self._tree_match_len = None
        limit = self._limit(num_draft_tokens)
        if limit == 0:
            if hedged:  # no room: no candidates to grow a tree from
                self._trie.clear()
                self._tree_match_len = 0
            return EMPTY_DRAFT
        if not hedged and self.lookup and not self._reads_predictions(tree=False):
            return self._chain(limit)
        looked_up, length, match_len = self._fill_trie(limit, *(self.tree_walk if hedged else self.chain_walk), first_only=not hedged,
                                                       predicted=PREDICTION_TREE_NODES if hedged else PREDICTION_CHAIN_NODES)
        if hedged:
            self._tree_match_len = looked_up
        return Draft.chain(self._chain_ids[:length].copy(), match_len, self._chain_origins[:length].copy()) if length else EMPTY_DRAFT

    def _chain_room(self, limit: int) -> None:
        if self._chain_ids.shape[0] < limit:  # (num_draft_tokens raised since)
            self._chain_ids, self._chain_origins = np.zeros(limit, dtype=np.int64), np.zeros(limit, dtype=np.int8)
            self._path = np.zeros(limit, dtype=np.int64)

    def _chain(self, limit: int) -> Draft:
        """propose's plain chain of at most `limit` tokens (lookup's alone: it reads no prediction table)."""
        self._chain_room(limit)
        length, match_len = self._lookup(draft_chain, limit, *self.chain_walk, True, self._chain_ids, self._chain_origins)
        self._read_table = False
        if not length:
            return EMPTY_DRAFT
        return Draft.chain(self._chain_ids[:length].copy(), match_len, self._chain_origins[:length].copy())

    def _lookup(self, kernel, num_draft_tokens: int, walk: int, substitution_walk: int, first_only: bool, *out):
        """Calls one of engine.chain's kernels (draft_chain, add_lookup_candidates) on this request's index and
        stores (their locks held: the documents store's, then memory's), into the trie; returns what it returns."""
        trie = self._trie
        trie.reserve(lookup_nodes(num_draft_tokens, walk, substitution_walk))
        lookup = lookup_group.py_func(num_draft_tokens=num_draft_tokens, prompt_len=self._prompt_len, walk=walk,
                                      substitution_walk=substitution_walk, first_reach=self.first_reach, first_only=first_only,
                                      draft_factor=self.draft_factor)
        work = work_group(trie=trie.arrays, ends=self._ends, scratch=self._scratch)
        with _reading(self._document_store) as documents, _reading(self.memory) as memory:
            result = kernel(tuple(self.index.buffers()), stores_group.py_func(documents=documents, memory=memory), lookup,
                            work, *out)
        trie.filled(int(self._scratch[0]))
        self._lookup_nodes = len(trie) + 1
        return result

    def propose_tree(self, num_draft_tokens: int | None = None, *, max_tree_nodes: int = DEFAULT_MAX_TREE_NODES) -> Draft:
        """Drafts a tree of at most `max_tree_nodes` nodes, branches up to `num_draft_tokens` deep (parents first)."""
        # The nodes are the `max_tree_nodes` heaviest of the candidate trie, each node's weight
        # discounted by TREE_DEPTH_DECAY per level (without it, one long candidate takes
        # every node before a branch of slightly lower weight gets one); `propose`'s chain is
        # the heaviest path (cut by draft_factor there, not here).
        self._check_thread()
        self._tree_match_len = None
        limit = self._limit(num_draft_tokens)
        if limit == 0 or max_tree_nodes < 1:
            return EMPTY_DRAFT
        self._tree_match_len = self._fill_trie(limit, *self.tree_walk, first_only=False, predicted=PREDICTION_TREE_NODES)[0]
        return self._tree(max_tree_nodes, first_class=0)  # whole: blended by weight

    def _grow_tree(self, max_tree_nodes: int) -> Draft:
        """A tree of the `max_tree_nodes` heaviest candidates of the last `propose(..., hedged=True)` (or `propose_tree`),
        lookup's before the prediction table's alone (a sized step's tree: see PREDICTION_TREE_NODES).

        Raises:
            RuntimeError: no tree's candidates were searched since the sequence last changed.
        """
        self._searched("_grow_tree")
        return self._tree(max_tree_nodes, first_class=self._lookup_nodes)  # sized: lookup's nodes first

    def _likeliest_tree(self, max_tree_nodes: int, keep_chance: float) -> tuple[Draft, np.ndarray, tuple]:
        """The `max_tree_nodes` candidates of the last `propose(..., hedged=True)` (or `propose_tree`) the model
        likeliest writes, likeliest first, each one's chance, and what `tree_chances.observe` learns from once they
        are verified: (estimates, which are the table's). A node's chance is its estimate (DraftTrie.likeliest:
        lookup's heaviest next token kept with `keep_chance`, its siblings in proportion to their weight) corrected
        by what such nodes kept (TreeChances). Every prefix of the draft is a tree, so a sizer cuts it where the
        next node no longer pays (sizing.rules.tree_size).

        Raises:
            RuntimeError: no tree's candidates were searched since the sequence last changed.
        """
        self._searched("_likeliest_tree")
        token_ids, parents, chances, estimates, table, sources = self._trie.likeliest(
            max_tree_nodes, keep_chance, self.tree_chances.correction(self._lookup_nodes))
        return Draft(token_ids, parents, self._tree_match_len, sources), chances, (estimates, table)

    def _searched(self, caller: str) -> None:
        self._check_thread()
        if self._tree_match_len is None:
            raise RuntimeError(f"{caller} drafts from the last propose(..., hedged=True) or propose_tree, and there is none since "
                               "the sequence changed")

    def _tree(self, max_tree_nodes: int, *, first_class: int) -> Draft:
        if max_tree_nodes < 1 or not len(self._trie):
            return EMPTY_DRAFT
        token_ids, parents, sources = self._trie.tree(max_tree_nodes, TREE_DEPTH_DECAY, first_class=first_class, origins=True)
        return Draft(token_ids, parents, self._tree_match_len, sources) if token_ids.shape[0] else EMPTY_DRAFT

    def _fill_trie(self, num_draft_tokens: int, walk: int, substitution_walk: int, *, first_only: bool,
                   predicted: int) -> tuple[int, int, int]:
        """Rebuilds the candidate trie and draws its chain into _chain_ids, _chain_origins; returns (the longest match_len
        anchoring a lookup candidate (0: none), the chain's length, its anchor).

        Lookup's candidates are engine.chain.add_lookup_candidates' (the kernel a plain chain's draft_chain
        calls: `_chain`), the table's and the chain engine.trees.hedged_chain's (draft_trees' rows call it
        too). Candidates are what followed, up to `num_draft_tokens` tokens:
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
        then the most recent, then the table. A node's origin (its drafted token's source in
        DraftStats) is the source of the candidate that created it: PROMPT or OUTPUT by where
        the copied token sits in the request, DOCUMENTS, MEMORY, PREDICTIONS.
        """
        trie = self._trie
        if self.lookup:
            looked_up = self._lookup(add_lookup_candidates, num_draft_tokens, walk, substitution_walk, first_only)
        else:
            trie.clear()
            looked_up, self._lookup_nodes = 0, 1
        # (predicted = 0, a plain chain's PREDICTION_CHAIN_NODES: nor pays for its scale)
        self._read_table = self.predictions is not None and predicted > 0 and len(self.index) > 0
        budget = predicted if self._read_table else 0
        self._chain_room(num_draft_tokens)
        trie.reserve(self._lookup_nodes + budget)
        table, lead, ranks = self.predictions, self.lead_chances, self.rank_chances
        ids = table.ids if self._read_table else NO_TABLE
        k = ids.shape[1]
        predicted_group = (ids, int(self.index.tokens[-1]) if budget else -1, lead.hits, lead.seen,
                           ranks.counts if ranks is not None else NO_RANKS, ranks.prior if ranks is not None else NO_RANKS,
                           self._rank_scratch, trie.heap(budget * k + k))
        count, length, match_len, first = hedged_chain(trie.arrays, self._lookup_nodes, looked_up, predicted_group,
                                                        (num_draft_tokens, budget, self.draft_factor), self._path,
                                                        self._chain_ids, self._chain_origins)
        trie.filled(count)
        if first >= 0:
            lead.drafted(looked_up, first)
        return looked_up, length, match_len

    def _limit(self, num_draft_tokens: int | None) -> int:
        return max(0, self.num_draft_tokens if num_draft_tokens is None else min(num_draft_tokens, self.num_draft_tokens))

    # -- transformers' assistant_model protocol ----------------------------------------------
    # transformers' generate() treats an assistant_model as a model: it reads `config`, `device` and
    # `generation_config`, calls `generate` each step and `_supports_logits_to_keep`. One adapter per
    # drafter answers them and owns that loop's per-request state (lookahead.integrations.assistant:
    # TransformersAssistant, whose `config` and `device` getters also check the call). They are
    # looked up here, not defined on the class, so help(LookupDrafter) lists what a user calls.

    def __getattr__(self, name):
        """What transformers reads on an assistant_model (config, device, generation_config, generate): the adapter's."""
        if name in _ADAPTER_NAMES:
            return getattr(self._transformers_assistant(), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _supports_logits_to_keep(self) -> bool:
        return False

    def _transformers_assistant(self):
        """The TransformersAssistant that answers transformers' reads on this drafter and owns that loop's state.

        Built on first use (which imports lookahead.integrations.assistant), one per drafter.
        """
        if self._transformers_adapter is None:
            from lookahead.integrations.assistant import TransformersAssistant

            with _ADAPTER_LOCK:  # one adapter per drafter, even when two threads first call at once
                if self._transformers_adapter is None:
                    self._transformers_adapter = TransformersAssistant(self)
        return self._transformers_adapter


def _reading(store: TokenStore | None):
    """The store's index tuple, its lock held in the block (TokenStore.reading); NO_STORE where there is none."""
    return store.reading() if store is not None else nullcontext(NO_STORE)
