"""index.kernels.count_continuations: how often an index's occurrences of an anchor went on with a chain."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead import TokenIndex
from lookahead.index.kernels import count_continuations


def brute_counts(tokens: list, m: int, path: list) -> list:
    """[occurrences of tokens' last m tokens ending before its last token, those followed by path[:1], path[:2], ...]."""
    n, suffix = len(tokens), tokens[-m:]
    counts = [0] * (len(path) + 1)
    for end in range(m - 1, n - 1):
        if tokens[end - m + 1 : end + 1] == suffix:
            counts[0] += 1
            a = 0
            while a < len(path) and end + 1 + a < n and tokens[end + 1 + a] == path[a]:
                a += 1
                counts[a] += 1
    return counts


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=2, max_size=60), st.integers(1, 4), st.lists(st.integers(0, 3), min_size=1, max_size=5),
       st.integers(1, 2))
def test_count_continuations_counts_every_occurrence(tokens, m, path, min_ngram):
    """With a reach past every occurrence, the counts are the brute force's, for any anchor length the index holds."""
    index = TokenIndex(min_ngram=min_ngram, max_ngram=4)
    index.extend(tokens)
    counts = np.zeros(len(path) + 1, dtype=np.int64)
    ends = np.zeros(5, dtype=np.int64)
    query = np.asarray(tokens, dtype=np.int32)
    count_continuations(index.buffers(), query, m, np.asarray(path, dtype=np.int64), len(path), 10_000, ends, counts)
    expected = brute_counts(tokens, m, path) if m >= min_ngram and m <= len(tokens) else [0] * (len(path) + 1)
    assert counts.tolist() == expected


def test_count_continuations_adds_a_store_and_stops_at_reach():
    """A second index adds to the counts (what advance does for documents and memory); `reach` bounds the walk."""
    request, store = TokenIndex(min_ngram=1, max_ngram=4), TokenIndex(min_ngram=1, max_ngram=4)
    request.extend([5, 6, 7, 1, 5, 6, 8, 2, 5, 6])  # "5 6" went on with 7 once and with 8 once
    store.extend([9, 5, 6, 7, 3])  # and with 7 once more elsewhere
    ends, counts, path = np.zeros(5, dtype=np.int64), np.zeros(3, dtype=np.int64), np.array([7, 1])
    query = np.asarray(request.tokens, dtype=np.int32)
    count_continuations(request.buffers(), query, 2, path, 2, 64, ends, counts)
    assert counts.tolist() == [2, 1, 1]
    count_continuations(store.buffers(), query[-4:], 2, path, 2, 64, ends, counts)
    assert counts.tolist() == [3, 2, 1]
    counts[:] = 0
    count_continuations(request.buffers(), query, 2, path, 2, 1, ends, counts)  # the most recent occurrence only
    assert counts.tolist() == [1, 0, 0]
