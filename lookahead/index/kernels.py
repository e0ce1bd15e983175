"""Numba kernels of the token index: module-level, arrays and scalars in, counts out.

Layout shared by every kernel (owned and grown by `TokenIndex`):

    tokens  int32[cap_tokens]  # tokens[pos] = token id at position pos; valid for pos < n
    table   int32[cap_slots]   # open addressing, linear probing; EMPTY or (end_pos << NGRAM_BITS) | (ngram - 1)

Invariant: for every ngram length `g` in [min_ngram, max_ngram] and every end position
`e <= n - 2` with `e >= g - 1`, the table holds exactly one slot for the g-gram
tokens[e - g + 1 : e + 1], and that slot stores the largest such `e` (the most recent
occurrence). Grams ending at the last position n - 1 are left out on purpose: they are
the suffix a query looks up, and an occurrence must end strictly before it.

A slot stores no key: it is verified by comparing tokens, so a hash collision costs a
comparison, never a wrong answer.
"""

import numpy as np
from numba import njit

EMPTY = -1
NGRAM_BITS = 4  # the ngram length (1..16) lives in the low 4 bits of a slot
MAX_NGRAM = 1 << NGRAM_BITS
MAX_POSITIONS = 1 << (31 - NGRAM_BITS)  # 134M tokens: end_pos must fit in the remaining bits

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_MIX = np.uint64(0x9E3779B97F4A7C15)
_FINAL = np.uint64(0xFF51AFD7ED558CCD)


@njit(cache=True, inline="always")
def _mix(h, token):
    # One step of a multiplicative hash; uint64 wraps.
    h = (h ^ np.uint64(token & 0xFFFFFFFF)) * _MIX
    return h ^ (h >> np.uint64(31))


@njit(cache=True, inline="always")
def _slot_of(h, ngram, cap):
    # Final avalanche, then Lemire's multiply-shift range reduction onto [0, cap).
    h = (h ^ np.uint64(ngram)) * _FINAL
    h ^= h >> np.uint64(33)
    return np.int64(((h >> np.uint64(32)) * np.uint64(cap)) >> np.uint64(32))


@njit(cache=True, inline="always")
def _same_gram(tokens, end_a, end_b, ngram):
    for i in range(ngram):
        if tokens[end_a - i] != tokens[end_b - i]:
            return False
    return True


@njit(cache=True)
def _insert(tokens, table, end, ngram, h):
    """Records that the `ngram`-gram ending at `end` occurred there. Returns 1 if a new slot was used."""
    cap = table.shape[0]
    slot = _slot_of(h, ngram, cap)
    while True:
        value = table[slot]
        if value == EMPTY:
            table[slot] = (end << NGRAM_BITS) | (ngram - 1)
            return 1
        if (value & (MAX_NGRAM - 1)) + 1 == ngram:
            other = value >> NGRAM_BITS
            if _same_gram(tokens, other, end, ngram):
                if end > other:  # keep the most recent occurrence
                    table[slot] = (end << NGRAM_BITS) | (ngram - 1)
                return 0
        slot += 1
        if slot == cap:
            slot = 0


@njit(cache=True)
def index_ends(tokens, table, start, stop, min_ngram, max_ngram):
    """Inserts every gram ending at positions start..stop-1. Returns the number of new slots.

    Cost: O((stop - start) * max_ngram) hashing plus one probe sequence per gram.
    """
    added = 0
    for end in range(start, stop):
        h = _FNV_OFFSET
        longest = min(max_ngram, end + 1)
        for ngram in range(1, longest + 1):
            h = _mix(h, tokens[end - ngram + 1])
            if ngram >= min_ngram:
                added += _insert(tokens, table, end, ngram, h)
    return added


@njit(cache=True)
def rehash(tokens, old_table, new_table):
    """Moves every slot of old_table into the empty new_table. Returns the slot count."""
    moved = 0
    for slot in range(old_table.shape[0]):
        value = old_table[slot]
        if value == EMPTY:
            continue
        end = value >> NGRAM_BITS
        ngram = (value & (MAX_NGRAM - 1)) + 1
        h = _FNV_OFFSET
        for i in range(ngram):
            h = _mix(h, tokens[end - i])
        moved += _insert(tokens, new_table, end, ngram, h)
    return moved


@njit(cache=True)
def _find(tokens, table, query_end, ngram, h):
    # Most recent earlier end position of the ngram-gram ending at query_end, or -1.
    cap = table.shape[0]
    slot = _slot_of(h, ngram, cap)
    while True:
        value = table[slot]
        if value == EMPTY:
            return -1
        if (value & (MAX_NGRAM - 1)) + 1 == ngram:
            other = value >> NGRAM_BITS
            if _same_gram(tokens, other, query_end, ngram):
                return other
        slot += 1
        if slot == cap:
            slot = 0


@njit(cache=True)
def longest_match(tokens, table, n, min_ngram, max_ngram, out):
    """Longest suffix of tokens[:n] (min_ngram..max_ngram long) that occurred earlier.

    Writes out[0] = its length (0 if none) and out[1] = the end position of its most
    recent earlier occurrence (-1 if none). Returns the length.
    Cost: O(max_ngram) probe sequences of O(max_ngram) comparisons; independent of n.
    """
    out[0] = 0
    out[1] = -1
    query_end = n - 1
    h = _FNV_OFFSET
    # An earlier occurrence of a g-gram ends at <= n - 2, so g <= n - 1.
    longest = min(max_ngram, n - 1)
    for ngram in range(1, longest + 1):
        h = _mix(h, tokens[query_end - ngram + 1])
        if ngram < min_ngram:
            continue
        end = _find(tokens, table, query_end, ngram, h)
        if end < 0:
            break  # a longer suffix contains this one, so it cannot occur either
        out[0] = ngram
        out[1] = end
    return out[0]


def warm_up() -> int:
    """Compiles (or loads from numba's cache) every kernel on a small real input; returns the match length.

    The input repeats a gram, so each kernel runs its full path, not an early exit.
    """
    tokens = np.array([3, 1, 4, 1, 5, 3, 1, 4], dtype=np.int32)
    table = np.full(64, EMPTY, dtype=np.int32)
    index_ends(tokens, table, 0, tokens.shape[0] - 1, 1, 4)
    bigger = np.full(128, EMPTY, dtype=np.int32)
    rehash(tokens, table, bigger)
    out = np.zeros(2, dtype=np.int64)
    return longest_match(tokens, bigger, tokens.shape[0], 1, 4, out)
