"""`DocumentStores`: the documents stores live requests consult, one per distinct selection, counted and released.

A request consults the store of the documents its prompt selects (DocumentLibrary.selection). Requests
that select the same documents share one store; it is built once (DocumentLibrary.store_of), copied
into an IndexArena (entry d = store d, the layout engine.kernels reads as `docs`), and released when
the last request consulting it goes. So the memory held follows the live requests' selections, never
every request served.
"""

import numpy as np

from lookahead.documents import DocumentLibrary
from lookahead.engine.arena import TABLE_AT, TOKEN_AT, IndexArena
from lookahead.engine.groups import docs_group
from lookahead.index.kernels import INDEX_N, INDEX_PREV, INDEX_TABLE, INDEX_TOKENS


class DocumentStores:
    """Stores of a DocumentLibrary's documents for the engine's kernels, shared by selection.

    Example:
        >>> library = DocumentLibrary()
        >>> library.add([5, 6, 7, 8])
        >>> stores = DocumentStores(library, min_ngram=1, max_ngram=4)
        >>> a, b = stores.acquire([1, 2]), stores.acquire([3])  # a small library: every request selects all of it
        >>> a == b, stores.live
        (True, 1)
        >>> stores.release(a); stores.release(b)
        >>> stores.live
        0
    """

    def __init__(self, library: DocumentLibrary, *, min_ngram: int, max_ngram: int):
        self.library = library
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.arena = IndexArena(0)  # entry d: store d's index
        self.n = np.zeros(0, dtype=np.int64)  # (doc,) tokens store d holds
        self._refs: list[int] = []  # (doc,) live requests consulting it
        self._keys: list = []  # (doc,) its selection
        self._doc_of: dict[tuple, int] = {}  # selection -> doc
        self._free: list[int] = []

    @property
    def live(self) -> int:
        """Stores some live request consults."""
        return len(self._doc_of)

    def arrays(self) -> tuple:
        """The kernels' `docs` group (engine.groups)."""
        return docs_group(arena=self.arena.arrays(), n=self.n)

    def acquire(self, prompt_ids) -> int:
        """The store a new request with this prompt consults (-1: none); counted until `release`."""
        if not len(self.library):
            return -1
        key = self.library.selection(prompt_ids)
        if not key:
            return -1
        d = self._doc_of.get(key)
        if d is None:
            d = self._doc_of[key] = self._new_entry(key)
        self._refs[d] += 1
        return d

    def release(self, d: int) -> None:
        """A request consulting store d is gone; the store goes with the last one (d = -1: nothing)."""
        if d < 0:
            return
        self._refs[d] -= 1
        if self._refs[d] == 0:
            del self._doc_of[self._keys[d]]
            self._keys[d] = None
            self.arena.free(d)
            self.n[d] = 0
            self._free.append(d)

    def _new_entry(self, key: tuple) -> int:
        store = self.library.store_of(key, min_ngram=self.min_ngram, max_ngram=self.max_ngram)
        if self._free:
            d = self._free.pop()
        else:
            d = len(self._refs)
            self._refs.append(0)
            self._keys.append(None)
            if d >= self.arena.entries:
                entries = max(d + 1, 2 * self.arena.entries)
                self.arena.grow_entries(entries)
                self.n = np.concatenate([self.n, np.zeros(entries - self.n.shape[0], dtype=np.int64)])
        with store.reading() as index:  # index/kernels.py's index tuple
            tokens, prev, table, n = index[INDEX_TOKENS], index[INDEX_PREV], index[INDEX_TABLE], index[INDEX_N]
            self.arena.allocate(d, max(n, 1), table.shape[0])
            at, table_at = int(self.arena.at[d, TOKEN_AT]), int(self.arena.at[d, TABLE_AT])
            self.arena.tokens[at : at + n] = tokens[:n]
            self.arena.prev[at : at + n] = prev[:n]
            self.arena.table[table_at : table_at + table.shape[0]] = table
        self.n[d] = n
        self._keys[d] = key
        return d
