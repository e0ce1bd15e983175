"""`RowCache`: the KV cache of a loop's active rows and which of its slots are each row's real tokens.

Rows share one length S; each row's real tokens may sit anywhere in it, the other slots
(left padding, a row's share of a step's fill, a tree's dropped branches) are marked unreal
and masked in every step (verify.build_block). After a step only the block's tail moves:
each row's kept entries are packed to the block's front (a gather over the last W slots)
and the cache is cut after the longest; the whole cache is gathered back to left-padded
rows without holes only when rows leave (they stop costing compute at once) or holes pass
a quarter of it. A single row never has holes: while no row has any, nothing is marked
(`real` is None) and a step's bookkeeping is a crop or a tail gather.
"""

import numpy as np
import torch

from lookahead.integrations.hf import drop_cache_tail, gather_cache_rows, gather_cache_tail


class RowCache:
    """A transformers cache over `rows` rows, and `real`: (rows, S) bools, slot s of row r holds one of its
    tokens (None: every slot of every row does).

    Example (a cache with no layers shows the bookkeeping alone):
        >>> from transformers import DynamicCache
        >>> cache = RowCache(DynamicCache(), rows=2)
        >>> cache.keep([0, 1], [[1, 2], [2]], width=3)  # a prefill block of 3: row 0 padded by 1, row 1 by 2
        >>> cache.real.int().tolist()
        [[0, 1, 1], [0, 0, 1]]
        >>> cache.keep([1], [[0, 1]], width=2)  # row 0 ended; row 1 kept its own token and one drafted
        >>> cache.real, len(cache)  # one row left, compacted: no holes
        (None, 3)
    """

    def __init__(self, cache, rows: int):
        self.cache = cache
        self.rows = rows
        self.length = 0  # S
        self.real: torch.Tensor | None = None  # a view of _buffer's first S columns
        self.counts: list[int] | None = None  # per row, its real slots (real's row sums); None: S each, where real is None
        self._buffer: torch.Tensor | None = None  # (rows, capacity >= S) bools: `real`'s storage, grown by doubling

    def __len__(self) -> int:
        return self.length

    def real_tokens(self) -> list[int]:
        """Per row, its real tokens in the cache."""
        return [self.length] * self.rows if self.counts is None else self.counts

    def slots(self) -> torch.Tensor:
        """(rows, S) bools: `real`, with every slot marked where it is None."""
        return torch.ones((self.rows, self.length), dtype=torch.bool) if self.real is None else self.real

    def keep(self, going: list[int], kept_blocks: list[list[int]], width: int) -> None:
        """After a step over `width` block slots: keeps the rows `going` (indices among the step's rows) and, of row
        going[i]'s block, the entries kept_blocks[i] (ascending, never empty; the step's block holds them at S + entry)."""
        if len(going) < self.rows:  # rows left: every row's real slots gathered to the front
            real = torch.cat([self.slots(), torch.zeros((self.rows, width), dtype=torch.bool)], dim=1)
            for r, kept in zip(going, kept_blocks):
                real[r, [self.length + k for k in kept]] = True
            self.compact(going, real)
            return
        if all(kept[-1] - kept[0] + 1 == len(kept) for kept in kept_blocks):  # chains: the kept entries stay where they are
            starts, stops = [kept[0] for kept in kept_blocks], [kept[-1] + 1 for kept in kept_blocks]
            added = max(stops)
            drop_cache_tail(self.cache, width - added)
        else:  # trees: each row's path packed to the block's front
            added = max(len(kept) for kept in kept_blocks)
            starts, stops = [0] * len(kept_blocks), [len(kept) for kept in kept_blocks]
            index = torch.tensor([kept + [0] * (added - len(kept)) for kept in kept_blocks])  # (rows, slots): offsets in the block
            gather_cache_tail(self.cache, self.length, index)
        if self.real is None and not any(starts) and min(stops) == added:  # still no holes
            self.length += added
            return
        self.counts = [count + stop - start for count, start, stop in zip(self.real_tokens(), starts, stops)]
        slots = np.arange(added)
        block = (slots >= np.array(starts)[:, None]) & (slots < np.array(stops)[:, None])  # (rows, added): the kept spans
        self._mark(torch.from_numpy(block))
        if self.length > 1.25 * max(self.counts) + 16:
            self.compact(list(range(self.rows)), self.real)

    def _mark(self, block: torch.Tensor) -> None:
        # appends `block` (rows, added) to `real`, in place where the buffer has room (no copy of the S columns before)
        start, stop = self.length, self.length + block.shape[1]
        if self._buffer is None or self._buffer.shape[1] < stop:
            buffer = torch.empty((self.rows, max(2 * stop, 64)), dtype=torch.bool)
            buffer[:, :start] = self.slots()
            self._buffer = buffer
        self._buffer[:, start:stop] = block
        self.real, self.length = self._buffer[:, :stop], stop

    def compact(self, going: list[int], real: torch.Tensor) -> None:
        """Keeps the rows `going`, each its real slots only (`real`: (rows, S) bools), left-padded: the whole cache gathered."""
        real = real[going]
        lengths = real.sum(dim=1)
        longest = int(lengths.max())
        index = torch.zeros((len(going), longest), dtype=torch.long)  # (rows, slots); a padding slot reads slot 0
        compacted = torch.zeros((len(going), longest), dtype=torch.bool)
        for i in range(len(going)):
            length = int(lengths[i])
            index[i, longest - length :] = real[i].nonzero()[:, 0]
            compacted[i, longest - length :] = True
        gather_cache_rows(self.cache, torch.tensor(going), index)
        self.rows, self.length = len(going), longest
        self.real = self._buffer = None if bool(compacted.all()) else compacted
        self.counts = None if self.real is None else lengths.tolist()
