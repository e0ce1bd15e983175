"""`Batch`: many requests drafted at once, one kernel call per step for every row (what the vLLM proposer drives).

Each live request holds a slot (engine.slots.Slots: its tokens and index in an IndexArena, its keep
rate, its pending chain) and the documents store its prompt selects (engine.documents); all share
one TokenStore as memory. A caller's step:

    batch.wait()                                    what the last step queued has run (memory, slots)
    slot = batch.start(prompt_ids, first, n)        a new request (then its row's slot in `slots`)
    batch.finish(slot)                              a request that left: filed into memory after this step
    decode = batch.begin(slots, ...)                the rows' room, their slots grown
    drafting, counted = batch.advance(bar=, force=) every row: learn, copy, index, draft its chain (out_*)
    drafted, sent = batch.commit(slots, num_tokens, sizes)   the plans: `sizes[r]` tokens of row r's chain sent
    batch.end_step(slots)                           the step's filing and indexing handed to the thread

Rows are the caller's (which request a row holds, and how many tokens of its draft the step verified);
the sizes are the caller's too (the vLLM proposer's load rule).
"""

import contextlib
import weakref

import numpy as np

from lookahead.documents import DocumentLibrary
from lookahead.engine import kernels
from lookahead.engine.between_steps import BetweenSteps
from lookahead.engine.documents import DocumentStores
from lookahead.engine.kernels import COPIED, DOC
from lookahead.engine.slots import Slots
from lookahead.index import TokenIndex, as_id_set
from lookahead.index.kernels import MAX_NGRAM
from lookahead.index.token_index import GROWTH, MAX_LOAD, MIN_SLOTS, MIN_TOKENS
from lookahead.policy import CHAIN_WALK
from lookahead.store import TokenStore
from lookahead.trie import NO_VOCAB_LIMIT

INDEX_AHEAD = 64  # rows' unindexed tokens worth indexing between steps (where fewer wait, the hand-off costs more than it
                  # saves: notes/README.md, "a cold step's calls, and indexing between steps"); a new prompt is hundreds


class Batch:
    """The drafting state of every live request of a served batch, and the kernels' buffers, owned here.

    Args:
        rows: rows expected per step (buffers grow past it); slots start at twice that.
        num_draft_tokens: K, the longest chain.
        max_model_len: no chain runs past it.
        min_ngram, max_ngram, draft_factor: LookupDrafter's options, which the chains follow.
        memory: the TokenStore finished requests are filed into and drafts copy from (None: none).
        documents: the DocumentLibrary requests consult (each its prompt's selection).
        eos_token_id: id(s) no chain runs past (None: none).
        min_tokens, min_table: a new slot's token and table capacities.
        thread: file and index between steps on a thread of the batch's own (False: at once, in `end_step`).
    """

    def __init__(self, *, rows: int, num_draft_tokens: int, max_model_len: int, min_ngram: int, max_ngram: int,
                 draft_factor: float, memory: TokenStore | None, documents: DocumentLibrary, eos_token_id=None,
                 min_tokens: int = MIN_TOKENS, min_table: int = MIN_SLOTS, thread: bool = True):
        self.k, self.max_model_len = num_draft_tokens, max_model_len
        self.memory = memory
        self.slots = Slots(2 * rows, num_draft_tokens, min_ngram, max_ngram, min_tokens=min_tokens, min_table=min_table)
        self.document_stores = DocumentStores(documents, min_ngram=min_ngram, max_ngram=max_ngram)
        self.worker = BetweenSteps() if thread else None  # its calls between this step and the next
        # the thread is joined on close(), when the batch is collected, and at interpreter exit (finalize's atexit)
        self._close_worker = weakref.finalize(self, self.worker.close) if thread else (lambda: None)
        self._finished: list = []  # the step's finished requests' tokens, filed after its drafts
        self._pending = 0  # tokens of the step's rows with room left unindexed (advance's count)
        self._step_rows: tuple = ()  # the step's per-row group (begin)
        nodes = 1 + (CHAIN_WALK[0] + CHAIN_WALK[1] + 4) * num_draft_tokens  # add_suffix_candidates' bound, and 2 stores
        eos = np.fromiter(sorted(as_id_set(eos_token_id)), dtype=np.int64)
        trie = (np.zeros(nodes, np.int64), np.zeros(nodes, np.int64), np.zeros(nodes, np.float64),
                np.zeros(nodes, np.int64), np.zeros(nodes, np.int64), eos, NO_VOCAB_LIMIT)  # (node,) trie.py's layout
        self._work = (trie, np.zeros(MAX_NGRAM + 1, dtype=np.int64), np.zeros(3, dtype=np.int64))  # advance's scratch
        self._no_memory = tuple(TokenIndex(min_ngram=min_ngram, max_ngram=max_ngram).buffers())  # an empty index
        self._options = (min_ngram, max_ngram, float(draft_factor), memory is not None)
        self._limits = (num_draft_tokens, max_model_len, max_ngram - min_ngram + 1, MAX_LOAD, GROWTH)  # room_and_growth's
        self.counts = np.zeros(5, dtype=np.int64)  # a step's verified drafts (kernels.count_drafts, run by advance)
        self.per_pos = np.zeros(num_draft_tokens, dtype=np.int64)
        self._rows = 0
        self._row_buffers(rows)

    def _row_buffers(self, rows: int) -> None:
        """The per-row buffers, for at least `rows` rows."""
        if rows <= self._rows:
            return
        self._rows = rows = max(rows, 2 * self._rows)
        k = self.k
        self.out_ids = np.zeros((rows, k), dtype=np.int64)  # (row, K) the chain drafted
        self.out_len = np.zeros(rows, dtype=np.int64)  # (row,) its length
        self.out_match = np.zeros(rows, dtype=np.int64)  # (row,) its anchor's length
        self.out_chance = np.zeros(rows, dtype=np.float64)  # (row,) its keep chance per token
        self.out_share = np.zeros((rows, k), dtype=np.float64)  # (row, K) its path's branch shares
        self.out_status = np.zeros(rows, dtype=np.int64)  # (row,) kernels.LEARNT, DISCARDED or NO_PLAN
        self.sizes = np.zeros(rows, dtype=np.int64)  # (row,) tokens of its chain sent (the caller's, for commit)
        self.room = np.zeros(rows, dtype=np.int64)  # (row,) the most tokens its chain may hold
        self._stale = np.zeros(rows, dtype=np.bool_)  # (row,) its slot holds another request (kernels.stale_rows)
        self._new_tokens = np.zeros(rows, dtype=np.int64)  # (row,) its slot's token capacity to grow to (0: none)
        self._new_table = np.zeros(rows, dtype=np.int64)  # (row,) its slot's table capacity to grow to (0: none)
        self._out = (self.out_ids, self.out_len, self.out_match, self.out_chance, self.out_share, self.out_status,
                     self.counts, self.per_pos)  # advance's `out` group

    # -- requests ------------------------------------------------------------------------------

    def start(self, prompt_ids: np.ndarray, first_token: int, num_tokens: int) -> int:
        """A slot for a new request whose prompt is `prompt_ids`, its row `num_tokens` long (its documents store acquired)."""
        doc = self.document_stores.acquire(prompt_ids)
        return self.slots.allocate(len(prompt_ids), doc, first_token, num_tokens)

    def finish(self, slot: int) -> None:
        """The request in `slot` is gone: its tokens are filed into memory after this step's drafts, its slot freed."""
        self.document_stores.release(int(self.slots.cols[slot, DOC]))
        if self.memory is not None and self.slots.cols[slot, COPIED]:
            self._finished.append(self.slots.tokens_of(slot).copy())
        self.slots.free(slot)

    def stale(self, slots: np.ndarray, num_tokens: np.ndarray, token_ids: np.ndarray) -> np.ndarray | None:
        """(row,) whether row r's slot (>= 0) holds another request's tokens (kernels.stale_rows), a view; None: no row's."""
        self._row_buffers(slots.shape[0])
        stale = self._stale[: slots.shape[0]]
        return stale if kernels.stale_rows(slots, num_tokens, token_ids, self.slots.cols, stale) else None

    # -- a step --------------------------------------------------------------------------------

    def wait(self) -> None:
        """Returns once what the last step handed to the thread has run (its error raised here)."""
        if self.worker is not None:
            self.worker.wait()

    def begin(self, slots, num_tokens, num_sampled, verified, theirs, token_ids) -> int:
        """The step's rows (slot slots[r], tokens token_ids[r, :num_tokens[r]], num_sampled[r] written this step,
        verified[r] of our draft's and theirs[r] of another's checked): room[r] for each row's chain, every slot
        grown for its new tokens (kernels.room_and_growth). Returns the decode rows (room > 0)."""
        num_rows = slots.shape[0]
        self._row_buffers(num_rows)
        s = self.slots
        new_tokens, new_table = self._new_tokens[:num_rows], self._new_table[:num_rows]
        self._step_rows = (slots, num_tokens, num_sampled, verified, theirs, self.room[:num_rows], token_ids)  # kernels' `rows`
        decode, grows = kernels.room_and_growth(self._step_rows, s.cols, s.index.at, self._limits, new_tokens, new_table)
        if grows:
            s.reserve(slots, new_tokens, new_table)  # the most the kernel may write
        return decode

    def advance(self, *, bar: float, force: bool) -> tuple[bool, bool]:
        """kernels.advance over the rows `begin` took: rows whose chance cannot clear `bar` are not drafted, unless
        `force`. Returns (whether any row drafted, whether any count is not 0); the chains are out_ids[r, :out_len[r]]."""
        s, memory = self.slots, self.memory
        # the memory's index is read in the kernel, under its lock (nothing else writes it meanwhile)
        with memory.reading() if memory is not None else contextlib.nullcontext(self._no_memory) as memory_index:
            drafting, counted, self._pending = kernels.advance(self._step_rows, s.state(), s.index.arrays(),
                                                               self.document_stores.arrays(), memory_index,
                                                               (*self._options, bar, force), self._work, self._out)
        return drafting, counted

    def commit(self, slots: np.ndarray, num_tokens: np.ndarray, sizes: np.ndarray) -> tuple[int, int]:
        """Records each drafted row's plan, `sizes[r]` tokens of its chain sent; returns (tokens drafted, tokens sent)."""
        return kernels.commit(slots, num_tokens, sizes, self._out, self.slots.state())

    def end_step(self, slots: np.ndarray) -> None:
        """The step's finished requests filed into memory, and its rows' unindexed tokens indexed where INDEX_AHEAD
        or more wait: on the thread, between this step and the next (the next `wait` returns once they have run)."""
        self._file_finished()
        if self._pending >= INDEX_AHEAD:  # what the rows that did not draft would index when they next draft
            self._between(self.slots.index_rows, slots, self.room[: slots.shape[0]])  # (the call holds the slots)
        self._pending = 0

    def _file_finished(self) -> None:
        for tokens in self._finished:
            self._between(self.memory.add, tokens)
        self._finished = []

    def _between(self, fn, *args) -> None:
        if self.worker is None:
            fn(*args)
        else:
            self.worker.submit(fn, *args)

    def flush(self) -> None:
        """Files every finished request into memory now (a step does so itself before it reads the memory)."""
        self._file_finished()
        self.wait()

    def close(self) -> None:
        """Finished requests filed; the thread runs what is queued and is joined."""
        self._file_finished()
        self._close_worker()
