"""`TokenIndex`: an incremental n-gram index over a growing sequence of token ids."""

from typing import NamedTuple

import numpy as np

from lookahead.index import kernels

DEFAULT_MIN_NGRAM = 1  # a single token may anchor a draft
DEFAULT_MAX_NGRAM = 8  # the longest suffix tried (longer ones add under 0.3% tau: notes/design-provenance.md)
MIN_SLOTS = 1024  # a new index's table slots
MIN_TOKENS = 256  # and tokens
_CHUNK = 4096  # end positions indexed per kernel call on a long extend
_warmed_up = False

MAX_TOKEN_ID = 2**31 - 2  # ids are stored as int32; 2**31 - 1 is SEPARATOR
SEPARATOR = MAX_TOKEN_ID + 1  # ends a sequence (end_sequence): no query holds it, so no match spans two sequences


class IndexBuffers(NamedTuple):
    """The arrays the kernels read (layout in kernels.py, its fields in INDEX_*'s order: a kernel takes them as
    `tuple(buffers)`); read-only, stale after the next mutation."""

    tokens: np.ndarray  # (cap_tokens,) int32; valid below n
    prev: np.ndarray  # (cap_tokens,) int32
    table: np.ndarray  # (cap_slots,) int32
    n: int  # tokens held
    min_ngram: int
    max_ngram: int


class TokenIndex:
    """Finds, in O(max_ngram²) at any length, what followed the current suffix last time.

    The index holds a sequence of token ids. `append`/`extend` add to its end;
    `longest_match` returns the longest suffix (between `min_ngram` and `max_ngram`
    tokens) that occurred earlier in the sequence, and where it most recently did;
    `continuation` reads the tokens that followed it.

    Cost: amortized O(max_ngram) hashing per appended token (plus one probe sequence per
    gram); O(max_ngram²) per query. Neither grows with the sequence length.
    Memory: 8 bytes per token (the token and a link to the previous occurrence of its
    shortest gram) plus 4 bytes per table slot; one slot per distinct
    (gram, length) pair, at most `max_ngram - min_ngram + 1` per token. The table keeps
    at most 82% of its slots used and grows by 1.5x, as does the token buffer, so the worst
    case (every gram new) is 4 * 1.83 * (max_ngram - min_ngram + 1) + 12 bytes per token:
    63.2 for lengths 2..8. Length-1 grams are bounded by the vocabulary in use, so real
    text with lengths 1..8 stays under 64: 30-55 bytes per token on BPE-tokenized code
    from 1k to 1M tokens (`lookahead bench --overhead`).

    The index only grows (or is cleared): drafters index verified tokens only, never a
    draft, so nothing is ever rolled back.

    Args:
        min_ngram: shortest suffix worth matching (>= 1).
        max_ngram: longest suffix tried (min_ngram..16).

    Example:
        >>> index = TokenIndex(min_ngram=1, max_ngram=3)
        >>> index.extend([5, 6, 7, 8, 5, 6])
        >>> index.longest_match()
        (2, 1)
        >>> index.continuation(1, 3).tolist()
        [7, 8, 5]
    """

    def __init__(self, *, min_ngram: int = DEFAULT_MIN_NGRAM, max_ngram: int = DEFAULT_MAX_NGRAM):
        if not isinstance(min_ngram, int) or not isinstance(max_ngram, int):
            raise TypeError(f"min_ngram and max_ngram must be int, got {min_ngram!r} and {max_ngram!r}")
        if not 1 <= min_ngram <= max_ngram <= kernels.MAX_NGRAM:
            raise ValueError(
                f"need 1 <= min_ngram <= max_ngram <= {kernels.MAX_NGRAM}, got min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        global _warmed_up
        if not _warmed_up:
            kernels.warm_up()
            _warmed_up = True
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self._tokens = np.zeros(MIN_TOKENS, dtype=np.int32)  # (cap_tokens,) token ids; valid below self._n
        self._prev = np.zeros(MIN_TOKENS, dtype=np.int32)  # (cap_tokens,) previous end of the same min_ngram-gram
        self._table = np.full(MIN_SLOTS, kernels.EMPTY, dtype=np.int32)  # (cap_slots,) see kernels.py
        self._n = 0  # tokens held
        self._used = 0  # table slots used
        self._ends = np.zeros(max_ngram + 1, dtype=np.int64)  # (max_ngram + 1,) out-buffer of kernels.match_ends

    def __len__(self) -> int:
        return self._n

    @property
    def tokens(self) -> np.ndarray:
        """A read-only view of the indexed tokens; stale after the next mutation."""
        view = self._tokens[: self._n]
        view.flags.writeable = False
        return view

    def buffers(self) -> IndexBuffers:
        """The arrays for kernels that read the index (the draft trie's); do not write them.

        Kernels take them as a plain tuple, `tuple(index.buffers())` (see kernels.py).
        """
        return IndexBuffers(tokens=self._tokens, prev=self._prev, table=self._table, n=self._n, min_ngram=self.min_ngram,
                            max_ngram=self.max_ngram)

    def _arrays(self) -> tuple:
        # buffers() as the plain tuple the kernels take; stale once a buffer is replaced
        return kernels.index_group.py_func(tokens=self._tokens, prev=self._prev, table=self._table, n=self._n,
                                           min_ngram=self.min_ngram, max_ngram=self.max_ngram)

    @property
    def nbytes(self) -> int:
        """Bytes held by the index's buffers."""
        return self._tokens.nbytes + self._prev.nbytes + self._table.nbytes

    def append(self, token: int) -> None:
        """Appends one token id."""
        self.extend(np.array([token], dtype=np.int64))

    def end_sequence(self) -> None:
        """Appends SEPARATOR: what follows is another sequence, and no match spans the two."""
        self._extend(np.array([SEPARATOR], dtype=np.int64))

    def extend(self, token_ids) -> None:
        """Appends token ids (any 1-D integer sequence; values in [0, 2**31))."""
        self._extend(as_token_ids(token_ids))

    def _extend(self, new: np.ndarray) -> None:
        count = new.shape[0]
        if count == 0:
            return
        if self._n + count > kernels.MAX_POSITIONS:
            raise ValueError(f"TokenIndex holds at most {kernels.MAX_POSITIONS} tokens, got {self._n + count}")
        if self._n + count > self._tokens.shape[0]:
            capacity = kernels.grown_tokens(self._tokens.shape[0], self._n + count)
            grown = np.zeros(capacity, dtype=np.int32)
            grown[: self._n] = self._tokens[: self._n]
            self._tokens = grown
            self._prev = np.resize(self._prev, capacity)
        start = self._n
        self._tokens[start : start + count] = new
        self._n += count
        # Grams ending at start-1 .. n-2 become searchable; the last position stays out.
        # Chunked so that reserving for the worst case (every gram new) never overgrows the table.
        grams_per_end = self.max_ngram - self.min_ngram + 1
        for lo in range(max(start - 1, 0), self._n - 1, _CHUNK):
            hi = min(lo + _CHUNK, self._n - 1)
            self._reserve((hi - lo) * grams_per_end)
            self._used += kernels.index_ends(self._arrays(), lo, hi)  # after _reserve: it may replace the table

    def clear(self) -> None:
        """Drops every token; keeps the buffers."""
        self._n = 0
        self._used = 0
        self._table.fill(kernels.EMPTY)

    def longest_match(self, query=None) -> tuple[int, int]:
        """(length, end) of the longest suffix that occurred in the index; its most recent occurrence.

        Without `query` the suffix is the index's own and only earlier occurrences count;
        with `query` (token ids of another sequence, only its last max_ngram matter) any
        occurrence does. `end` is the position of the occurrence's last token, so its
        continuation starts at end + 1. Returns (0, -1) when no suffix of at least
        min_ngram tokens occurred.
        """
        length = self._match(query)
        return (length, int(self._ends[length])) if length else (0, -1)

    def _match(self, query) -> int:
        if query is None:
            return kernels.match_ends(self._arrays(), self._tokens, self._n, self._ends)
        if not (isinstance(query, np.ndarray) and query.dtype == np.int64):
            query = as_token_ids(query, name="query")
        query = query[-self.max_ngram :]
        return kernels.match_ends(self._arrays(), query, query.shape[0], self._ends)

    def continuation(self, end: int, max_tokens: int) -> np.ndarray:
        """Up to `max_tokens` token ids that followed position `end` (a copy, int64)."""
        if not -1 <= end < self._n:
            raise ValueError(f"end must be in [-1, {self._n}), got {end}")
        return self._tokens[end + 1 : min(end + 1 + max_tokens, self._n)].astype(np.int64)

    def _reserve(self, new_slots: int) -> None:
        # Grows the table so that `new_slots` more slots keep it at most kernels.MAX_LOAD full.
        capacity = kernels.grown_table(self._table.shape[0], self._used + new_slots)
        if capacity == self._table.shape[0]:
            return
        table = np.full(capacity, kernels.EMPTY, dtype=np.int32)
        self._used = kernels.rehash(self._tokens, self._table, table)
        self._table = table


_FEW = 64  # as_token_ids checks a list of at most this many ids in Python: a numpy call costs more


def as_token_ids(token_ids, *, name: str = "token ids") -> np.ndarray:
    """A 1-D sequence of token ids in [0, MAX_TOKEN_ID] as int64 numpy (no copy if it already is).

    Accepts lists, tuples, numpy arrays and integer torch tensors (read without importing torch).

    Raises:
        TypeError: not a sequence of integers (str, set, generator, float or bool values).
        ValueError: not 1-D, ragged, or an id out of range.
    """
    if type(token_ids) is list and len(token_ids) <= _FEW:  # a step's tokens (the loops pass lists): checked without numpy
        for t in token_ids:
            if type(t) is not int or not 0 <= t <= MAX_TOKEN_ID:
                break  # the checks below say what is wrong
        else:
            return np.array(token_ids, dtype=np.int64)
    if hasattr(token_ids, "detach"):  # a torch tensor, without importing torch here
        if token_ids.dtype.is_floating_point or token_ids.dtype.is_complex:
            raise TypeError(f"{name} must be integers, got a tensor of dtype {token_ids.dtype}")
        token_ids = token_ids.detach().cpu().numpy()
    elif isinstance(token_ids, (str, bytes, set, frozenset, dict)) or not hasattr(token_ids, "__len__"):
        raise TypeError(f"{name} must be a 1-D sequence of ints (list, tuple, numpy array or tensor), got {type(token_ids).__name__}")
    try:
        array = np.asarray(token_ids)
    except ValueError:  # numpy refuses ragged nesting
        raise ValueError(f"{name} must be 1-D, got a ragged nested sequence") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {array.dtype}")
    if array.dtype == np.uint64 and int(array.max()) > MAX_TOKEN_ID:
        raise ValueError(f"{name} must be in [0, {MAX_TOKEN_ID}], got {int(array.max())}")
    array = array.astype(np.int64, copy=False)
    bad = kernels.first_invalid(array, MAX_TOKEN_ID + 1)
    if bad >= 0:
        raise ValueError(f"{name} must be in [0, {MAX_TOKEN_ID}], got {int(array[bad])} at position {bad}")
    return array


def as_id_set(token_ids) -> frozenset[int]:
    """Token id(s) as a frozenset of ints: None (none), an int, or a list, tuple, numpy array or tensor of ints.

    How every layer reads an `eos_token_id` (the drafter's option, a generation config's).

    Raises:
        TypeError: a value that is not an int.

    Example:
        >>> sorted(as_id_set(2)), sorted(as_id_set([2, 7])), as_id_set(None)
        ([2], [2, 7], frozenset())
    """
    if token_ids is None:
        return frozenset()
    if isinstance(token_ids, (int, np.integer)):
        return frozenset([int(token_ids)])
    if hasattr(token_ids, "tolist"):  # a numpy array or tensor, 0-d included
        token_ids = token_ids.tolist()
        if isinstance(token_ids, int):
            return frozenset([token_ids])
    ids = list(token_ids) if hasattr(token_ids, "__iter__") else [token_ids]
    if not all(isinstance(t, (int, np.integer)) for t in ids):
        raise TypeError(f"eos_token_id must be an int or a list of ints, got {token_ids!r}")
    return frozenset(int(t) for t in ids)
