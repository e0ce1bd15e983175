"""`Batch`: many requests drafted at once, one kernel call per step for every row (what the vLLM proposer drives).

Each live request, named by the caller's key, holds a slot (engine.slots.Slots: its tokens and index
in an IndexArena, its keep rate, its pending chain) and the documents store its prompt selects
(engine.documents); all share one TokenStore as memory. Rows move between steps (a served batch
condenses, swaps, reuses them), so state is keyed by request, never by row. A caller's step:

    batch.wait()                                    what the last step queued has run (memory, slots)
    batch.finish_absent(keys, live)                 requests that left: filed into memory after this step
    slots, joined = batch.slots_of(keys, ...)       each row's slot; new requests started, restarted ones anew
        (or keys = batch.match_rows(...) first, where the caller cannot name its rows' requests)
    verified, theirs = batch.verified(slots, ...)   how much of the last step's drafts the step verified
    decode = batch.begin(slots, ...)                the rows' room, their slots grown
    drafting, counted = batch.advance(bar=, force=) every row: learn, copy, index, draft its chain (out_*)
    out, drafted, sent = batch.commit(slots, num_tokens, sizes)   the plans: `sizes[r]` tokens of row r's chain sent
    batch.end_step(slots)                           the step's filing and indexing handed to the thread

Which request a row holds, which tokens of its draft the step checked and the sizes are the caller's
(the vLLM proposer's: vLLM's request ids, its spec_token_ids, its load rule).
"""

import contextlib
import weakref

import numpy as np

from lookahead.documents import DocumentLibrary
from lookahead.engine import kernels
from lookahead.engine.between_steps import BetweenSteps
from lookahead.engine.chain import NO_STORE, lookup_nodes
from lookahead.engine.documents import DocumentStores
from lookahead.engine.groups import OPTIONS_TOKEN_CHANCES, options_group, out_group, rows_group, work_group
from lookahead.engine.kernels import COPIED, DOC, PLAN_POS
from lookahead.engine.slots import Slots
from lookahead.engine.trees import draft_trees
from lookahead.index import as_id_set
from lookahead.index.kernels import MAX_NGRAM
from lookahead.index.token_index import MIN_SLOTS, MIN_TOKENS
from lookahead.policy import CHAIN_WALK
from lookahead.sizing.rules import MAX_CHANCE
from lookahead.store import TokenStore
from lookahead.trie import NO_VOCAB_LIMIT, trie_group

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
        vocab_size: the model's vocabulary size (None: unknown): no chain holds an id at or above it.
        token_chances: whether `advance` prices each chain token (out_chance; the bar's gate reads it). False: a
            caller that sizes chains from kernels.keep_chances alone and always advances with `force` (out_chance
            is not written).
        min_tokens, min_table: a new slot's token and table capacities.
        thread: file and index between steps on a thread of the batch's own (False: at once, in `end_step`).
    """

    def __init__(self, *, rows: int, num_draft_tokens: int, max_model_len: int, min_ngram: int, max_ngram: int,
                 draft_factor: float, memory: TokenStore | None, documents: DocumentLibrary, eos_token_id=None,
                 vocab_size: int | None = None, token_chances: bool = True, min_tokens: int = MIN_TOKENS,
                 min_table: int = MIN_SLOTS, thread: bool = True):
        if vocab_size is not None and (not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1):
            raise ValueError(f"vocab_size must be a positive int or None, got {vocab_size!r}")
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
        nodes = lookup_nodes(num_draft_tokens, *CHAIN_WALK)
        eos = np.fromiter(sorted(as_id_set(eos_token_id)), dtype=np.int64)
        trie = trie_group(token=np.zeros(nodes, np.int64), parent=np.zeros(nodes, np.int64), weight=np.zeros(nodes, np.float64),
                          child=np.zeros(nodes, np.int64), sibling=np.zeros(nodes, np.int64), eos=eos,
                          vocab_limit=NO_VOCAB_LIMIT if vocab_size is None else int(vocab_size),
                          origin=np.zeros(nodes, np.int8))  # (node,) trie.py's layout
        self._work = work_group(trie=trie, ends=np.zeros(MAX_NGRAM + 1, dtype=np.int64), scratch=np.zeros(3, dtype=np.int64))
        self._options = options_group(min_ngram=min_ngram, max_ngram=max_ngram, draft_factor=float(draft_factor),
                                      token_chances=bool(token_chances))
        self._grams = max_ngram - min_ngram + 1  # gram lengths indexed (room_and_growth's)
        self.counts = np.zeros(5, dtype=np.int64)  # a step's verified drafts (kernels.count_drafts, run by advance)
        self.per_pos = np.zeros(num_draft_tokens, dtype=np.int64)
        self.requests: dict = {}  # the caller's request key -> its slot, in arrival order
        self.started = self.finished = 0  # requests started, requests finished
        self._sent: dict = {}  # slot -> the token ids sent for it at the last step (only where any), read by `verified`
        self._keys_seen, self._slots_seen = None, None  # slots_of's last keys and their slots
        self._finished_since = False  # whether a request finished since _slots_seen
        self._row_keys: list = []  # match_rows: the key of each row at its last call
        self._next_key = 0  # match_rows: keys made
        self._rows = 0
        self._row_buffers(rows)

    def _row_buffers(self, rows: int) -> None:
        """The per-row buffers, for at least `rows` rows."""
        if rows <= self._rows:
            return
        self._rows = rows = max(rows, 2 * self._rows)
        k = self.k
        self.out_ids = np.zeros((rows, k), dtype=np.int64)  # (row, K) the chain drafted
        self.out_origin = np.zeros((rows, k), dtype=np.int8)  # (row, K) its tokens' sources (lookahead.draft's codes)
        self.out_len = np.zeros(rows, dtype=np.int64)  # (row,) its length
        self.out_match = np.zeros(rows, dtype=np.int64)  # (row,) its anchor's length
        self.out_chance = np.zeros((rows, k), dtype=np.float64)  # (row, K) the chance each of its tokens is kept
        self.out_count = np.zeros((rows, k + 1), dtype=np.int64)  # (row, K + 1) its anchor's occurrences, and those its tokens followed
        self.out_status = np.zeros(rows, dtype=np.int64)  # (row,) kernels.LEARNT, DISCARDED or NO_PLAN
        self.sizes = np.zeros(rows, dtype=np.int64)  # (row,) tokens of its chain sent (the caller's, for commit)
        self.room = np.zeros(rows, dtype=np.int64)  # (row,) the most tokens its chain may hold
        self._stale = np.zeros(rows, dtype=np.bool_)  # (row,) its slot holds another request (kernels.stale_rows)
        self._new_tokens = np.zeros(rows, dtype=np.int64)  # (row,) its slot's token capacity to grow to (0: none)
        self._new_table = np.zeros(rows, dtype=np.int64)  # (row,) its slot's table capacity to grow to (0: none)
        self._ours = np.zeros(rows, dtype=np.int64)  # (row,) tokens of our last draft the step verified (`verified`)
        self._theirs = np.zeros(rows, dtype=np.int64)  # (row,) tokens of another's draft it verified
        self._out = out_group(ids=self.out_ids, origin=self.out_origin, len=self.out_len, match=self.out_match, chance=self.out_chance,
                              status=self.out_status, counts=self.counts, per_pos=self.per_pos, count=self.out_count)

    # -- requests, by the caller's key -----------------------------------------------------------

    def start(self, key, prompt_ids: np.ndarray, first_token: int, num_tokens: int) -> int:
        """A slot for the new request `key` whose prompt is `prompt_ids`, its row `num_tokens` long (its documents store acquired)."""
        doc = self.document_stores.acquire(prompt_ids)
        slot = self.requests[key] = self.slots.allocate(len(prompt_ids), doc, first_token, num_tokens)
        self.started += 1
        return slot

    def finish(self, key, tokens: np.ndarray | None = None) -> None:
        """The request `key` is gone: its tokens (those its slot copied, or `tokens`, its whole sequence where the
        caller has more) are filed into memory after this step's drafts, its slot freed."""
        slot = self.requests.pop(key)
        self._finished_since = True
        self._sent.pop(slot, None)
        self.document_stores.release(int(self.slots.cols[slot, DOC]))
        if tokens is None and self.slots.cols[slot, COPIED]:
            tokens = self.slots.tokens_of(slot).copy()
        if self.memory is not None and tokens is not None and len(tokens):
            self._finished.append(tokens)
        self.slots.free(slot)
        self.finished += 1

    def finish_absent(self, keys: list, live) -> None:
        """Finishes every request neither among `keys` (the step's rows) nor in `live` (the caller's live keys: a set
        or a dict's keys), in arrival order: the memory's order is deterministic. Cost: a list compare where the rows
        are the last step's and no other request is held."""
        if keys == self._keys_seen and len(self.requests) == len(keys):
            return
        gone = self.requests.keys() - live
        if gone:
            gone -= set(keys)
            for key in [k for k in self.requests if k in gone]:
                self.finish(key)

    def slots_of(self, keys: list, num_tokens: np.ndarray, token_ids: np.ndarray, prompt_lens=None) -> tuple[np.ndarray, bool]:
        """(row,) the slot of row r's request keys[r], and whether a request joined (a key not held before).

        A new key is started with prompt_lens[r] of its row's tokens as its prompt (None: all of them). A key whose row
        no longer extends its slot's tokens (kernels.stale_rows: the caller reused the key for another request) is
        finished and started anew, not counted as joined. Cost: a list compare where the rows are the last call's and
        none finished since, then one kernel over the rows.
        """
        if keys == self._keys_seen and not self._finished_since:
            slots, joined = self._slots_seen.copy(), False
        else:
            slot_of = [self.requests.get(key, -1) for key in keys]
            slots, joined = np.array(slot_of, dtype=np.int64), -1 in slot_of
        self._row_buffers(slots.shape[0])
        stale = self._stale[: slots.shape[0]]
        unslotted = joined  # whether any row has no slot (-1): a new request, or one finished as stale just below
        if kernels.stale_rows(slots, num_tokens, token_ids, self.slots.cols, stale):
            for row in np.flatnonzero(stale).tolist():
                self.finish(keys[row])
                slots[row] = -1
            unslotted = True
        for row in (np.flatnonzero(slots < 0).tolist() if unslotted else ()):
            n = int(num_tokens[row])
            prompt_len = n if prompt_lens is None else min(int(prompt_lens[row]), n)
            slots[row] = self.start(keys[row], token_ids[row, :prompt_len], int(token_ids[row, 0]) if n else -1, n)
        self._keys_seen, self._slots_seen, self._finished_since = keys, slots, False
        return slots, joined

    def match_rows(self, num_rows: int, num_tokens: np.ndarray, token_ids: np.ndarray) -> list:
        """A key for each row, for a caller that cannot name its rows' requests: the request whose tokens the row still
        extends (its last holder tried first), else a new key; requests no row extends are finished (a preempted one
        is started anew when it returns). Cost: a compare of up to 2 x 32 tokens per row and held request."""
        previous = self._row_keys + [None] * max(0, num_rows - len(self._row_keys))
        taken: set = set()
        keys: list = []
        for row in range(num_rows):
            n = int(num_tokens[row])
            key = next((k for k in [previous[row], *self.requests]
                        if k is not None and k not in taken and k in self.requests
                        and self._extends(self.requests[k], token_ids[row], n)), None)
            if key is None:
                key, self._next_key = f"row-content-{self._next_key}", self._next_key + 1
            taken.add(key)
            keys.append(key)
        for key in [k for k in self.requests if k not in taken]:
            self.finish(key)
        self._row_keys = keys
        return keys

    def _extends(self, slot: int, row: np.ndarray, n: int, window: int = 32) -> bool:
        """Whether row[:n] extends what `slot` copied (checked on its first and last `window` tokens)."""
        seen = self.slots.tokens_of(slot)
        m = seen.shape[0]
        if m == 0 or m > n:
            return False
        head = min(window, m)
        return np.array_equal(seen[:head], row[:head]) and np.array_equal(seen[m - head :], row[m - head : m])

    def verified(self, slots: np.ndarray, num_tokens: np.ndarray, num_sampled: list, checked=None) -> tuple[np.ndarray, np.ndarray]:
        """(row,) twice: how many tokens of our last draft for row r's request the step that just ran verified, and how
        many of a draft another made (a serving engine's own placeholders, which its metrics count as drafts too); views.

        A draft is verified in the step right after `commit` sent it, which moves its row from the plan's position by
        num_sampled[r] tokens (a list). checked[r] (a list per row, or None: not known) is the drafted tokens the step
        verified for row r: a prefix of what we sent is ours, anything else another's. Without `checked`, a sent draft
        whose row moved so counts whole (the sent map holds only the last step's rows: a request that sat a step
        out, preempted say, counts none).
        """
        num_rows = slots.shape[0]
        self._row_buffers(num_rows)
        ours, theirs = self._ours[:num_rows], self._theirs[:num_rows]
        sent_of = self._sent
        if checked is not None:  # the rows whose step verified any drafted token (the caller's lists, read in place)
            rows = [row for row, ids in enumerate(checked[:num_rows]) if ids]
        elif sent_of:
            rows = [row for row, s in enumerate(slots.tolist()) if s in sent_of]
        else:
            rows = []
        if not rows:
            ours[:] = 0
            theirs[:] = 0
            return ours, theirs
        # Python lists in the loop, numpy once on each side of it (a numpy scalar read or write is ~0.2 µs, a list's ~0.03)
        slot_of, n_of, pos_of = slots.tolist(), num_tokens.tolist(), self.slots.cols[slots, PLAN_POS].tolist()
        ours_of, theirs_of = [0] * num_rows, [0] * num_rows
        for row in rows:
            sent = sent_of.get(slot_of[row], ())
            moved = bool(sent) and n_of[row] == pos_of[row] + num_sampled[row]
            if checked is None:
                ours_of[row] = len(sent) if moved else 0
                continue
            size = len(checked[row])
            if moved and checked[row] == sent[:size]:
                ours_of[row] = size
            elif num_sampled[row]:
                theirs_of[row] = size
        ours[:] = ours_of
        theirs[:] = theirs_of
        return ours, theirs

    # -- a step --------------------------------------------------------------------------------

    def wait(self) -> None:
        """Returns once what the last step handed to the thread has run (its error raised here)."""
        if self.worker is not None:
            self.worker.wait()

    def begin(self, slots, num_tokens, num_sampled, verified, theirs, token_ids, room: np.ndarray | None = None) -> int:
        """The step's rows (slot slots[r], tokens token_ids[r, :num_tokens[r]], num_sampled[r] written this step,
        verified[r] of our draft's and theirs[r] of another's checked): room[r] for each row's chain (at most the
        caller's `room[r]`, where given), every slot grown for its new tokens (kernels.room_and_growth). Returns the
        decode rows (room > 0)."""
        num_rows = slots.shape[0]
        self._row_buffers(num_rows)
        self._sent = {}  # the last step's, read by `verified`; this step's commit writes it anew
        s = self.slots
        new_tokens, new_table = self._new_tokens[:num_rows], self._new_table[:num_rows]
        self._step_rows = rows_group(slot=slots, num_tokens=num_tokens, num_sampled=num_sampled, verified=verified,
                                     theirs=theirs, room=self.room[:num_rows], token_ids=token_ids)
        decode, grows = kernels.room_and_growth(self._step_rows, s.cols, s.index.at, self.k, self.max_model_len, self._grams,
                                                new_tokens, new_table)
        if grows:
            s.reserve(slots, new_tokens, new_table)  # the most the kernel may write
        if room is not None:  # (a smaller room needs no more growth than the kernel found)
            rooms = self.room[:num_rows]
            np.minimum(rooms, room[:num_rows], out=rooms)
            decode = int(np.count_nonzero(rooms))
        return decode

    def advance(self, *, bar: float, force: bool) -> tuple[bool, bool]:
        """kernels.advance over the rows `begin` took: rows whose chance cannot clear `bar` are not drafted, unless
        `force`. Returns (whether any row drafted, whether any count is not 0); the chains are out_ids[r, :out_len[r]],
        their tokens' sources out_origin[r, :out_len[r]]."""
        if not force and not self._options[OPTIONS_TOKEN_CHANCES]:
            raise ValueError("advance(force=False) gates rows on their chains' chances: build the Batch with token_chances=True")
        s, memory = self.slots, self.memory
        # the memory's index is read in the kernel, under its lock (nothing else writes it meanwhile)
        with memory.reading() if memory is not None else contextlib.nullcontext(NO_STORE) as memory_index:
            drafting, counted, self._pending = kernels.advance(self._step_rows, s.state(), s.index.arrays(),
                                                               self.document_stores.arrays(), memory_index,
                                                               self._options, bar, force, self._work, self._out)
        return drafting, counted

    def advance_trees(self, trees, table: np.ndarray) -> None:
        """A tree step over the rows `begin` took: each row learnt from its last step as `advance` does (no chain
        drafted there), then its tree's candidates and hedged chain (engine.trees.draft_trees, `trees` a TreeRows;
        `table`: PredictionTable.ids, (0, 0) where there is none); the chains in out_ids, as `advance` leaves them."""
        s, memory = self.slots, self.memory
        with memory.reading() if memory is not None else contextlib.nullcontext(NO_STORE) as memory_index:
            arena, docs = s.index.arrays(), self.document_stores.arrays()
            # no row's chance can beat MAX_CHANCE: advance learns and counts, and drafts none
            kernels.advance(self._step_rows, s.state(), arena, docs, memory_index, self._options, MAX_CHANCE, False,
                            self._work, self._out)
            draft_trees(self._step_rows, s.state(), arena, docs, memory_index, self._options, table, trees.arrays(), self._out)
        self._pending = 0  # draft_trees indexed every row with room

    def commit(self, slots: np.ndarray, num_tokens: np.ndarray, sizes: np.ndarray) -> tuple[list[list[int]], int, int]:
        """Records each drafted row's plan, `sizes[r]` tokens of its chain sent (what the next step's `verified` checks).
        Returns (per row the token ids sent, as lists, [] for none; tokens drafted; tokens sent)."""
        drafted, sent_tokens = kernels.commit(slots, num_tokens, sizes, self._out, self.slots.state())
        out: list[list[int]] = [[] for _ in range(slots.shape[0])]
        if sent_tokens:  # a loop over Python lists, numpy called once per row sent: numpy's per-call cost is what a step saves on
            ids, slot_of, sent = self.out_ids, slots.tolist(), self._sent
            for row, size in enumerate(sizes[: slots.shape[0]].tolist()):
                if size:
                    out[row] = sent[slot_of[row]] = ids[row, :size].tolist()
        return out, drafted, sent_tokens

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
