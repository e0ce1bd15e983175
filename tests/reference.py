"""Brute-force references the fast code is tested against."""


def longest_match(tokens, min_ngram, max_ngram):
    """(length, end) of the longest suffix of `tokens` that occurred earlier; most recent occurrence."""
    n = len(tokens)
    for ngram in range(min(max_ngram, n - 1), min_ngram - 1, -1):
        suffix = list(tokens[n - ngram :])
        for end in range(n - 2, ngram - 2, -1):
            if list(tokens[end - ngram + 1 : end + 1]) == suffix:
                return ngram, end
    return 0, -1
