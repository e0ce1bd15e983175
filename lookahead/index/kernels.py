"""Numba kernels of the token index: module-level, arrays and scalars in, counts out.

The index reaches a kernel as one plain tuple, `index_group(tokens=, prev=, table=, n=, min_ngram=,
max_ngram=)` (the fields of `IndexBuffers`; owned and grown by `TokenIndex`), each field read by its
constant (`index[INDEX_N]`):

    tokens  int32[cap_tokens]  # tokens[pos] = token id at position pos; valid for pos < n
    prev    int32[cap_tokens]  # prev[end] = previous end of the min_ngram-gram ending at end (-1: none); for end <= n - 2
    table   int32[cap_slots]   # open addressing, linear probing; EMPTY or (end_pos << NGRAM_BITS) | (ngram - 1)
    n, min_ngram, max_ngram    # tokens held; the gram lengths indexed

A plain tuple, not the NamedTuple: numba types a plain tuple of arrays from a cached
fingerprint, a NamedTuple through Python (about 0.5 us more a call); a tuple index that is a
module-level int is resolved when the kernel compiles.

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
GROWTH = 1.5  # not 2: keeps the worst-case bytes per token under TokenIndex's documented bound
MAX_LOAD = 0.82  # table slots used / slots, at most (past it, the table grows)
INDEX_TOKENS, INDEX_PREV, INDEX_TABLE, INDEX_N, INDEX_MIN_NGRAM, INDEX_MAX_NGRAM = range(6)  # the index tuple's fields

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_MIX = np.uint64(0x9E3779B97F4A7C15)
_FINAL = np.uint64(0xFF51AFD7ED558CCD)


@njit(cache=True, inline="always")
def index_group(tokens, prev, table, n, min_ngram, max_ngram):
    """The kernels' index tuple, in its constants' order: called with every field named (in Python, `.py_func`)."""
    return (tokens, prev, table, n, min_ngram, max_ngram)


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
def _same_gram(tokens, end, query, query_end, ngram):
    # tokens[end - ngram + 1 : end + 1] == query[query_end - ngram + 1 : query_end + 1]
    for i in range(ngram):
        if tokens[end - i] != query[query_end - i]:
            return False
    return True


@njit(cache=True)
def _insert(tokens, table, end, ngram, h):
    """Records that the `ngram`-gram ending at `end` occurred there.

    Returns the end it held before (its previous occurrence), or -1 if the gram is new.
    """
    cap = table.shape[0]
    slot = _slot_of(h, ngram, cap)
    while True:
        value = table[slot]
        if value == EMPTY:
            table[slot] = (end << NGRAM_BITS) | (ngram - 1)
            return -1
        if (value & (MAX_NGRAM - 1)) + 1 == ngram:
            other = value >> NGRAM_BITS
            if _same_gram(tokens, other, tokens, end, ngram):
                if end > other:  # keep the most recent occurrence
                    table[slot] = (end << NGRAM_BITS) | (ngram - 1)
                return other
        slot += 1
        if slot == cap:
            slot = 0


@njit(cache=True)
def grown_tokens(capacity, needed):
    """The capacity a token region of `capacity` grows to to hold `needed` tokens: GROWTH times it, or `needed` where
    that is more; `capacity` where it holds them already. Each token is copied O(1) times, amortized.

    The rule of every token index's tokens (TokenIndex's, and the engine's slots': engine.kernels.room_and_growth).
    """
    if needed <= capacity:
        return capacity
    return max(int(capacity * GROWTH), needed)


@njit(cache=True)
def grown_table(capacity, needed):
    """The capacity a table of `capacity` slots grows to for `needed` slots used: times GROWTH until they fill it at
    most MAX_LOAD; `capacity` where they do already. Each slot is rehashed O(1) times, amortized.

    The rule of every token index's table (TokenIndex's, and the engine's slots': engine.kernels.room_and_growth).
    """
    while needed > MAX_LOAD * capacity:
        capacity = max(int(capacity * GROWTH), capacity + 1)  # (+ 1: from 0 or 1, where GROWTH alone stays put)
    return capacity


@njit(cache=True)
def index_ends(index, start, stop):
    """Inserts every gram ending at positions start..stop-1 into the index's table. Returns the number of new slots.

    Also links occurrences of the shortest grams: prev[end] = the previous end of the
    min_ngram-gram ending at `end` (-1 if none).
    Cost: O((stop - start) * max_ngram) hashing plus one probe sequence per gram.
    """
    tokens, prev, table = index[INDEX_TOKENS], index[INDEX_PREV], index[INDEX_TABLE]
    min_ngram, max_ngram = index[INDEX_MIN_NGRAM], index[INDEX_MAX_NGRAM]
    added = 0
    for end in range(start, stop):
        prev[end] = -1
        h = _FNV_OFFSET
        longest = min(max_ngram, end + 1)
        for ngram in range(1, longest + 1):
            h = _mix(h, tokens[end - ngram + 1])
            if ngram >= min_ngram:
                before = _insert(tokens, table, end, ngram, h)
                if before < 0:
                    added += 1
                if ngram == min_ngram:
                    prev[end] = before
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
        _insert(tokens, new_table, end, ngram, h)
        moved += 1
    return moved


@njit(cache=True)
def _find(tokens, table, query, query_end, ngram, h):
    # Most recent end position in `tokens` of the ngram-gram query[query_end - ngram + 1 : query_end + 1], or -1.
    cap = table.shape[0]
    slot = _slot_of(h, ngram, cap)
    while True:
        value = table[slot]
        if value == EMPTY:
            return -1
        if (value & (MAX_NGRAM - 1)) + 1 == ngram:
            other = value >> NGRAM_BITS
            if _same_gram(tokens, other, query, query_end, ngram):
                return other
        slot += 1
        if slot == cap:
            slot = 0


@njit(cache=True)
def match_ends(index, query, query_len, ends):
    """For each length g, the most recent end in the index's tokens of the g-token suffix of query[:query_len].

    Writes ends[g] (-1 where that suffix does not occur; lengths outside min_ngram..max_ngram
    are -1 too) and returns the longest length found (0 if none). `ends` has max_ngram + 1
    entries. For the index's own sequence pass query=tokens, query_len=n: grams ending at
    n - 1 are not in the table, so every occurrence found is an earlier one.
    Cost: O(max_ngram) probe sequences of O(max_ngram) comparisons; independent of n.
    """
    tokens, table = index[INDEX_TOKENS], index[INDEX_TABLE]
    min_ngram, max_ngram = index[INDEX_MIN_NGRAM], index[INDEX_MAX_NGRAM]
    for g in range(ends.shape[0]):
        ends[g] = -1
    query_end = query_len - 1
    h = _FNV_OFFSET
    longest = 0
    for ngram in range(1, min(max_ngram, query_len) + 1):
        h = _mix(h, query[query_end - ngram + 1])
        if ngram < min_ngram:
            continue
        end = _find(tokens, table, query, query_end, ngram, h)
        if end < 0:
            break  # a longer suffix contains this one, so it cannot occur either
        ends[ngram] = end
        longest = ngram
    return longest


@njit(cache=True)
def count_continuations(index, query, m, path, length, reach, ends, counts):
    """counts[0] += the occurrences of query's last m tokens among the `reach` most recent in the index
    (each ending before the index's last token); counts[1 + j] += those of them followed by path[:j + 1].
    `ends` (max_ngram + 1,) is scratch. Cost: O(max_ngram) probes and O(reach * (m + length))."""
    tokens, prev, n = index[INDEX_TOKENS], index[INDEX_PREV], index[INDEX_N]
    min_ngram, max_ngram = index[INDEX_MIN_NGRAM], index[INDEX_MAX_NGRAM]
    if m < min_ngram or m > max_ngram or n < 2 or match_ends(index, query, query.shape[0], ends) < m:
        return
    end = ends[m]
    walked = 0
    while end >= 0 and walked < reach:  # the occurrences of the last min_ngram tokens, most recent first
        if end >= m - 1 and _same_gram(tokens, end, query, query.shape[0] - 1, m):
            counts[0] += 1
            a = 0
            while a < length and end + 1 + a < n and tokens[end + 1 + a] == path[a]:
                counts[1 + a] += 1
                a += 1
        end = prev[end]
        walked += 1


@njit(cache=True)
def first_invalid(ids, limit):
    """Index of the first id outside [0, limit), or -1."""
    for i in range(ids.shape[0]):
        if ids[i] < 0 or ids[i] >= limit:
            return i
    return -1


def warm_up() -> int:
    """Compiles (or loads from numba's cache) every kernel on a small real input; returns the match length.

    The input repeats a gram, so each kernel runs its full path, not an early exit.
    """
    tokens = np.array([3, 1, 4, 1, 5, 3, 1, 4], dtype=np.int32)
    n = tokens.shape[0]
    prev = np.zeros(n, dtype=np.int32)
    table = np.full(64, EMPTY, dtype=np.int32)
    index_ends(index_group(tokens=tokens, prev=prev, table=table, n=n, min_ngram=1, max_ngram=4), 0, n - 1)
    bigger = np.full(128, EMPTY, dtype=np.int32)
    rehash(tokens, table, bigger)
    ends = np.zeros(5, dtype=np.int64)
    first_invalid(ends, 1)
    first_invalid(tokens.astype(np.int64), 1)
    grown_tokens(n, n + 1)
    grown_table(table.shape[0], n)
    return match_ends(index_group(tokens=tokens, prev=prev, table=bigger, n=n, min_ngram=1, max_ngram=4), tokens, n, ends)
