"""`IndexArena`: the token indexes of many entries (live requests, documents stores) in three arrays, one owner.

    tokens  int32[T]      entry e's tokens: tokens[at[e, TOKEN_AT] : at[e, TOKEN_AT] + at[e, TOKEN_CAP]]
    prev    int32[T]      its prev links, at the same place (index/kernels.py's layout)
    table   int32[TT]     its hash table: table[at[e, TABLE_AT] : at[e, TABLE_AT] + at[e, TABLE_CAP]]
    at      int64[E, 4]   (TOKEN_AT, TOKEN_CAP, TABLE_AT, TABLE_CAP); a free entry's capacities are 0

An entry's region is an index of its own (positions in its table count from its first token), so a
kernel views it by slicing (`engine.kernels.view`) and a region moves by a plain copy. Regions are
taken at the ends of the arrays; a region given up (its entry grown or freed) is garbage until the
arena rebuilds: when a region does not fit at the ends, the live regions are copied to the front of
arrays at least twice what they and the new region need (the same arrays' size where that is enough:
a compaction). So the arrays hold at most twice the most the live regions and the one being taken
ever needed: memory follows the live requests at their peak, never every request served. The arrays are replaced when they grow or
compact: callers pass them to each kernel call anew (`arrays`), never keep a view across a change.
"""

import numpy as np

from lookahead.engine.groups import arena_group
from lookahead.index.kernels import EMPTY, rehash

TOKEN_AT, TOKEN_CAP, TABLE_AT, TABLE_CAP = range(4)  # columns of IndexArena.at


class IndexArena:
    """Regions of three int32 arrays for `entries` token indexes, grown and compacted here alone.

    Example:
        >>> arena = IndexArena(2)
        >>> arena.allocate(0, 4, 8)
        >>> arena.tokens_of(0, 3)[:] = [7, 8, 9]
        >>> arena.resize(0, 16, 8, copied=3, used=0)  # grown: the 3 tokens move with it
        0
        >>> arena.tokens_of(0, 3).tolist(), int(arena.at[0, TOKEN_CAP])
        ([7, 8, 9], 16)
        >>> arena.free(0)
        >>> int(arena.at[0, TOKEN_CAP]), arena.live_tokens
        (0, 0)
    """

    def __init__(self, entries: int):
        self.at = np.zeros((entries, 4), dtype=np.int64)  # (entry, 4) where its regions lie (columns above)
        self.tokens = np.zeros(0, dtype=np.int32)  # (T,)
        self.prev = np.zeros(0, dtype=np.int32)  # (T,)
        self.table = np.zeros(0, dtype=np.int32)  # (TT,)
        self.token_end = self.table_end = 0  # the first free position of each: regions are taken there
        self.live_tokens = self.live_table = 0  # positions in live regions
        self.compactions = 0
        self._arrays = self._group()  # arrays(), rebuilt wherever one is replaced

    @property
    def entries(self) -> int:
        return self.at.shape[0]

    def arrays(self) -> tuple:
        """The kernels' `arena` group (engine.groups): what a kernel takes to view any entry (valid until the next
        allocate, resize or free)."""
        return self._arrays

    def _group(self) -> tuple:
        return arena_group(tokens=self.tokens, prev=self.prev, table=self.table, at=self.at)

    def grow_entries(self, entries: int) -> None:
        """Room for `entries` entries (the new ones free)."""
        if entries > self.entries:
            at = np.zeros((entries, 4), dtype=np.int64)
            at[: self.entries] = self.at
            self.at = at
            self._arrays = self._group()

    def allocate(self, e: int, token_capacity: int, table_capacity: int) -> None:
        """Free entry `e` gets a region of each size, its table empty."""
        if self.at[e, TOKEN_CAP] or self.at[e, TABLE_CAP]:
            raise ValueError(f"entry {e} is in use: free it first")
        token_at, table_at = self._take(token_capacity, table_capacity)
        self.table[table_at : table_at + table_capacity] = EMPTY
        at = self.at
        at[e, TOKEN_AT], at[e, TOKEN_CAP], at[e, TABLE_AT], at[e, TABLE_CAP] = token_at, token_capacity, table_at, table_capacity
        self.live_tokens += token_capacity
        self.live_table += table_capacity

    def resize(self, e: int, token_capacity: int, table_capacity: int, *, copied: int, used: int) -> int:
        """Moves entry `e` to regions of these sizes (at least its current ones), its first `copied` tokens and its
        table's `used` slots with it (rehashed into the new table when it grows). Returns the new table's used slots."""
        old = self.at[e].copy()
        token_capacity = max(token_capacity, int(old[TOKEN_CAP]))
        table_capacity = max(table_capacity, int(old[TABLE_CAP]))
        grow_tokens, grow_table = token_capacity > old[TOKEN_CAP], table_capacity > old[TABLE_CAP]
        if not (grow_tokens or grow_table):
            return used
        token_at, table_at = self._take(token_capacity if grow_tokens else 0, table_capacity if grow_table else 0)
        old = self.at[e].copy()  # (_take may have compacted: the entry's regions moved)
        if grow_tokens:
            src, dst = int(old[TOKEN_AT]), token_at
            self.tokens[dst : dst + copied] = self.tokens[src : src + copied]
            self.prev[dst : dst + copied] = self.prev[src : src + copied]
            self.at[e, TOKEN_AT], self.at[e, TOKEN_CAP] = token_at, token_capacity
            self.live_tokens += token_capacity - int(old[TOKEN_CAP])
        if grow_table:
            table = self.table[table_at : table_at + table_capacity]
            table[:] = EMPTY
            if used:  # the old table's slots, rehashed into the bigger one over the entry's (possibly moved) tokens
                start = int(self.at[e, TOKEN_AT])
                tokens = self.tokens[start : start + int(self.at[e, TOKEN_CAP])]
                used = rehash(tokens, self.table[old[TABLE_AT] : old[TABLE_AT] + old[TABLE_CAP]], table)
            self.at[e, TABLE_AT], self.at[e, TABLE_CAP] = table_at, table_capacity
            self.live_table += table_capacity - int(old[TABLE_CAP])
        return used

    def free(self, e: int) -> None:
        """Entry `e`'s regions become garbage; the entry is free."""
        self.live_tokens -= int(self.at[e, TOKEN_CAP])
        self.live_table -= int(self.at[e, TABLE_CAP])
        self.at[e] = 0

    def tokens_of(self, e: int, n: int) -> np.ndarray:
        """Entry e's first n tokens (a view, valid until the arena next changes)."""
        start = int(self.at[e, TOKEN_AT])
        return self.tokens[start : start + min(n, int(self.at[e, TOKEN_CAP]))]

    def _take(self, tokens: int, table: int) -> tuple[int, int]:
        """Places for regions of `tokens` and `table` positions at the arrays' ends: grown or compacted first if full."""
        if self.token_end + tokens > self.tokens.shape[0] or self.table_end + table > self.table.shape[0]:
            self._rebuild(max(self.tokens.shape[0], 2 * (self.live_tokens + tokens)),
                          max(self.table.shape[0], 2 * (self.live_table + table)))
        token_at, table_at = self.token_end, self.table_end
        self.token_end += tokens
        self.table_end += table
        return token_at, table_at

    def _rebuild(self, token_size: int, table_size: int) -> None:
        # The live regions copied to the front of arrays of these sizes (the same sizes: a compaction). Sizes are
        # at least twice the live regions and the one being taken, so a rebuild (O(live)) is followed by as much
        # again taken before the next.
        self.compactions += (token_size, table_size) == (self.tokens.shape[0], self.table.shape[0])
        tokens, prev = np.zeros(token_size, dtype=np.int32), np.zeros(token_size, dtype=np.int32)
        table = np.full(table_size, EMPTY, dtype=np.int32)
        token_end = table_end = 0
        for e in np.flatnonzero(self.at[:, TOKEN_CAP] | self.at[:, TABLE_CAP]).tolist():
            t, tc = int(self.at[e, TOKEN_AT]), int(self.at[e, TOKEN_CAP])
            b, bc = int(self.at[e, TABLE_AT]), int(self.at[e, TABLE_CAP])
            tokens[token_end : token_end + tc] = self.tokens[t : t + tc]
            prev[token_end : token_end + tc] = self.prev[t : t + tc]
            table[table_end : table_end + bc] = self.table[b : b + bc]
            self.at[e, TOKEN_AT], self.at[e, TABLE_AT] = token_end, table_end
            token_end, table_end = token_end + tc, table_end + bc
        self.tokens, self.prev, self.table = tokens, prev, table
        self.token_end, self.table_end = token_end, table_end
        self._arrays = self._group()
