"""`RowCache`: the KV cache of a loop's active rows and which of its slots are each row's real tokens.

Rows share one length S; each row's real tokens may sit anywhere in it, the other slots
(left padding, a row's share of a step's fill, a tree's dropped branches) are marked unreal
and masked in every step (verify.build_block). After a step only the block's tail moves:
each row's kept entries are packed to the block's front (a gather over the last W slots)
and the cache is cut after the longest; the whole cache is gathered back to left-padded
rows without holes only when rows leave (they stop costing compute at once) or holes pass
a quarter of it. A single row never has holes.
"""

import torch

from lookahead.integrations.hf import drop_cache_tail, gather_cache_rows, gather_cache_tail


class RowCache:
    """A transformers cache over `rows` rows, and `real`: (rows, S) bools, slot s of row r holds one of its tokens.

    Example (a cache with no layers shows the bookkeeping alone):
        >>> from transformers import DynamicCache
        >>> cache = RowCache(DynamicCache(), rows=2)
        >>> cache.keep([0, 1], [[1, 2], [2]], width=3)  # a prefill block of 3: row 0 padded by 1, row 1 by 2
        >>> cache.real.int().tolist()
        [[0, 1, 1], [0, 0, 1]]
        >>> cache.keep([1], [[0, 1]], width=2)  # row 0 ended; row 1 kept its own token and one drafted
        >>> cache.real.int().tolist(), len(cache)
        ([[1, 1, 1]], 3)
    """

    def __init__(self, cache, rows: int):
        self.cache = cache
        self.real = torch.zeros((rows, 0), dtype=torch.bool)  # (rows, S)

    def __len__(self) -> int:
        return self.real.shape[1]

    def real_tokens(self) -> list[int]:
        """Per row, its real tokens in the cache."""
        return self.real.sum(dim=1).tolist()

    def keep(self, going: list[int], kept_blocks: list[list[int]], width: int) -> None:
        """After a step over `width` block slots: keeps the rows `going` (indices among the step's rows) and, of row
        going[i]'s block, the entries kept_blocks[i] (ascending; the step's block holds them at S + entry)."""
        start = self.real.shape[1]  # the block's first slot
        longest = max(len(kept) for kept in kept_blocks)
        contiguous = all(kept[-1] - kept[0] + 1 == len(kept) for kept in kept_blocks if kept)
        if contiguous and len(going) == self.real.shape[0]:  # chains: the kept entries stay where they are
            end = max(kept[-1] + 1 for kept in kept_blocks)
            block = torch.zeros((len(going), end), dtype=torch.bool)
            for i, kept in enumerate(kept_blocks):
                block[i, kept[0] : kept[-1] + 1] = True
            drop_cache_tail(self.cache, width - end)
            self.real = torch.cat([self.real, block], dim=1)
        elif len(going) == self.real.shape[0]:  # trees: each row's path packed to the block's front
            index = torch.zeros((len(going), longest), dtype=torch.long)  # (rows, slots): offsets in the block
            block = torch.zeros((len(going), longest), dtype=torch.bool)
            for i, kept in enumerate(kept_blocks):
                index[i, : len(kept)] = torch.tensor(kept)
                block[i, : len(kept)] = True
            gather_cache_tail(self.cache, start, index)
            self.real = torch.cat([self.real, block], dim=1)
        else:
            self.real = torch.cat([self.real, torch.zeros((self.real.shape[0], width), dtype=torch.bool)], dim=1)
            for r, kept in zip(going, kept_blocks):
                self.real[r, [start + k for k in kept]] = True
            self.compact(going)
            return
        if self.real.shape[1] > 1.25 * int(self.real.sum(dim=1).max()) + 16:
            self.compact(list(range(self.real.shape[0])))

    def compact(self, going: list[int]) -> None:
        """Keeps the rows `going`, each its real slots only, left-padded: the whole cache gathered."""
        real = self.real[going]
        lengths = real.sum(dim=1)
        longest = int(lengths.max())
        index = torch.zeros((len(going), longest), dtype=torch.long)  # (rows, slots); a padding slot reads slot 0
        compacted = torch.zeros((len(going), longest), dtype=torch.bool)
        for i in range(len(going)):
            length = int(lengths[i])
            index[i, longest - length :] = real[i].nonzero()[:, 0]
            compacted[i, longest - length :] = True
        gather_cache_rows(self.cache, torch.tensor(going), index)
        self.real = compacted
