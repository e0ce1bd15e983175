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
        self.real: torch.Tensor | None = None
        self.counts: list[int] | None = None  # per row, its real slots (real's row sums); None: S each, where real is None

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
            self.real = torch.cat([self.slots(), torch.zeros((self.rows, width), dtype=torch.bool)], dim=1)
            for r, kept in zip(going, kept_blocks):
                self.real[r, [self.length + k for k in kept]] = True
            self.compact(going)
            return
        if all(kept[-1] - kept[0] + 1 == len(kept) for kept in kept_blocks):  # chains: the kept entries stay where they are
            added = max(kept[-1] + 1 for kept in kept_blocks)
            spans = [(kept[0], kept[-1] + 1) for kept in kept_blocks]
            drop_cache_tail(self.cache, width - added)
        else:  # trees: each row's path packed to the block's front
            added = max(len(kept) for kept in kept_blocks)
            spans = [(0, len(kept)) for kept in kept_blocks]
            index = torch.tensor([kept + [0] * (added - len(kept)) for kept in kept_blocks])  # (rows, slots): offsets in the block
            gather_cache_tail(self.cache, self.length, index)
        if self.real is None and all(span == (0, added) for span in spans):  # still no holes
            self.length += added
            return
        low, high = np.array(spans).T[:, :, None]  # (rows, 1) each: the row's kept span of the added slots
        block = torch.from_numpy((np.arange(added) >= low) & (np.arange(added) < high))
        self.counts = [count + int(h - l) for count, l, h in zip(self.real_tokens(), low[:, 0], high[:, 0])]
        self.real = torch.cat([self.slots(), block], dim=1)
        self.length += added
        if self.length > 1.25 * max(self.counts) + 16:
            self.compact(list(range(self.rows)))

    def compact(self, going: list[int]) -> None:
        """Keeps the rows `going`, each its real slots only, left-padded: the whole cache gathered."""
        real = self.slots()[going]
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
        self.real = None if bool(compacted.all()) else compacted
        self.counts = None if self.real is None else lengths.tolist()
