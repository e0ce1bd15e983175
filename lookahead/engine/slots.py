"""`Slots`: the batched engine's per-request state, one slot per live request; every array owned and grown here.

The arrays' layout, and the column names of `cols`, are engine.kernels'; the slots' token indexes
are entries of an IndexArena (engine.arena), entry s = slot s. A kernel gets them as `state()`'s
groups, taken anew at each call: growth replaces arrays, so nothing keeps an old one.
"""

import numpy as np

from lookahead.engine import kernels
from lookahead.engine.arena import IndexArena
from lookahead.engine.groups import slots_group
from lookahead.engine.kernels import CHANCE_SCALE, COPIED, DOC, FIRST_TOKEN, LAST_CHANCE, LAST_TOKEN, NUM_COLS, PLAN_LEN, PROMPT_LEN, USED
from lookahead.index.kernels import grown_table  # a slot's index grows as a TokenIndex does
from lookahead.index.token_index import MIN_SLOTS, MIN_TOKENS

HEADROOM = 2.0  # a new slot's regions hold this many times its row's tokens (its prompt): room for an output as long


class Slots:
    """Per-request drafting state for the kernels: `capacity` slots (doubled when all are taken).

    Args:
        slots: slots allocated up front.
        num_draft_tokens: K, the longest chain (plan_ids' width).
        min_ngram, max_ngram: the index's grams (the keep rate's lengths are 0..max_ngram).
        min_tokens, min_table: a new slot's token and table capacities.
        indexes: whether the slots hold token indexes (an arena); without, they hold what a request learns and
            plans alone (lookahead.request.Request: its drafter holds its index).
    """

    def __init__(self, slots: int, num_draft_tokens: int, min_ngram: int, max_ngram: int, *,
                 min_tokens: int = MIN_TOKENS, min_table: int = MIN_SLOTS, indexes: bool = True):
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.k = num_draft_tokens
        self.min_tokens, self.min_table = min_tokens, min_table
        self.capacity = 0
        m, k, w = max_ngram + 1, num_draft_tokens, kernels.MAX_WATCHED
        self.cols = np.zeros((0, NUM_COLS), dtype=np.int64)  # (slot, NUM_COLS) kernels' columns
        self.keep = np.zeros((0, m, 2), dtype=np.float64)  # (slot, M + 1, 2) faded (kept, failed) per anchor length
        self.overall = np.zeros((0, 2), dtype=np.float64)  # (slot, 2) faded (kept, failed) over every length
        self.plan_ids = np.zeros((0, k), dtype=np.int32)  # (slot, K) the pending chain
        self.watch = np.zeros((0, w, 5), dtype=np.int64)  # (slot, W, 5) watched rests (kernels' layout)
        self.watch_ids = np.zeros((0, w, k), dtype=np.int32)  # (slot, W, K) their tokens
        self.index = IndexArena(0) if indexes else None  # entry s: slot s's token index
        self._free: list[int] = []
        self._grow_slots(slots)

    def _grow_slots(self, slots: int) -> None:
        old = self.capacity

        def grown(array):
            bigger = np.zeros((slots, *array.shape[1:]), dtype=array.dtype)
            bigger[:old] = array
            return bigger

        self.cols, self.keep, self.overall = grown(self.cols), grown(self.keep), grown(self.overall)
        self.plan_ids, self.watch, self.watch_ids = grown(self.plan_ids), grown(self.watch), grown(self.watch_ids)
        if self.index is not None:
            self.index.grow_entries(slots)
        self._free.extend(range(slots - 1, old - 1, -1))
        self.capacity = slots
        self._state = self._group()

    def widen(self, num_draft_tokens: int) -> None:
        """Room for chains of `num_draft_tokens` tokens (plan_ids' and watch_ids' width)."""
        if num_draft_tokens > self.k:
            for name in ("plan_ids", "watch_ids"):
                array = getattr(self, name)
                wider = np.zeros((*array.shape[:-1], num_draft_tokens), dtype=array.dtype)
                wider[..., : self.k] = array
                setattr(self, name, wider)
            self.k = num_draft_tokens
            self._state = self._group()

    def _group(self) -> tuple:
        return slots_group(cols=self.cols, keep=self.keep, overall=self.overall, plan_ids=self.plan_ids, watch=self.watch,
                           watch_ids=self.watch_ids)

    def state(self) -> tuple:
        """The kernels' `slots` group (engine.groups), until the slots next grow."""
        return self._state

    def allocate(self, prompt_len: int, doc: int, first_token: int, tokens: int = 0) -> int:
        """A cleared slot for a new request that holds `tokens` tokens: its index regions sized at once for HEADROOM
        times them (a prompt would otherwise grow them several times, and its output again: each growth copies the
        tokens and rehashes the table)."""
        if not self._free:
            self._grow_slots(2 * self.capacity)
        s = self._free.pop()
        cols = self.cols
        cols[s] = 0
        cols[s, PROMPT_LEN], cols[s, DOC], cols[s, FIRST_TOKEN], cols[s, LAST_TOKEN], cols[s, PLAN_LEN] = prompt_len, doc, first_token, -1, -1
        cols[s, LAST_CHANCE] = CHANCE_SCALE  # a new request drafts on its first step
        self.keep[s] = 0.0
        self.overall[s] = 1.0
        self.watch[s, 0, 0] = 0
        if self.index is not None:
            planned = int(HEADROOM * tokens)
            table = grown_table(self.min_table, planned * (self.max_ngram - self.min_ngram + 1))  # at once, not step by step
            self.index.allocate(s, max(self.min_tokens, planned + 1), table)
        return s

    def free(self, s: int) -> None:
        """The request in slot s is gone: its regions are the arena's garbage, the slot free."""
        if self.index is not None:
            self.index.free(s)
        self._free.append(s)

    def tokens_of(self, s: int) -> np.ndarray:
        """The slot's copied tokens (a view, valid until the slots next change)."""
        return self.index.tokens_of(s, int(self.cols[s, COPIED]))

    def index_rows(self, rows_slot: np.ndarray, room: np.ndarray) -> None:
        """kernels.index_rows over these slots (the arrays passed are held by the call until it returns)."""
        kernels.index_rows(rows_slot, room, self.cols, self.index.arrays(), self.min_ngram, self.max_ngram)

    def reserve(self, slots: np.ndarray, new_tokens: np.ndarray, new_table: np.ndarray) -> None:
        """Grows row r's slot, slots[r], to new_tokens[r] tokens and a table of new_table[r] slots (0: as it is):
        the capacities kernels.room_and_growth found the step needs (the growth rule is there)."""
        for r in np.flatnonzero(new_tokens | new_table).tolist():
            s = int(slots[r])
            self.cols[s, USED] = self.index.resize(s, int(new_tokens[r]), int(new_table[r]), copied=int(self.cols[s, COPIED]),
                                                   used=int(self.cols[s, USED]))
