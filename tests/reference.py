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


def store_continuation(sequences, query, min_ngram, max_ngram, num_draft_tokens):
    """(match_len, continuation) of the most recent occurrence of the longest suffix of `query`
    (min_ngram..max_ngram tokens) in any of `sequences`, cut at that sequence's end."""
    for g in range(min(max_ngram, len(query)), min_ngram - 1, -1):
        gram = list(query[-g:])
        for seq in reversed(sequences):
            seq = list(seq)
            for end in range(len(seq) - 1, g - 2, -1):
                if seq[end - g + 1 : end + 1] == gram:
                    return g, seq[end + 1 : end + 1 + num_draft_tokens]
    return 0, []


def trie_weights(candidates, eos=(), vocab_limit=2**31):
    """{path (tuple of tokens): summed weight} over candidates (token list, weight), each cut before an EOS
    or an id at or above vocab_limit."""
    weights = {}
    for tokens, weight in candidates:
        path = ()
        for token in _cut(tokens, eos, vocab_limit):
            path += (token,)
            weights[path] = weights.get(path, 0.0) + weight
    return weights


def _cut(tokens, eos, vocab_limit):
    """tokens up to the first EOS or id at or above vocab_limit."""
    kept = []
    for token in tokens:
        if token in eos or token >= vocab_limit:
            break
        kept.append(token)
    return kept


def heaviest_path(candidates, vocab_limit=2**31):
    """The path that follows the heaviest child at each level; among equals the child the earliest candidate created.

    Candidates are cut before an id at or above vocab_limit, as the trie cuts them."""
    candidates = [(_cut(tokens, (), vocab_limit), weight) for tokens, weight in candidates]
    path = ()
    while True:
        weights = {}  # next token -> summed weight, in order of the first candidate through it
        for tokens, weight in candidates:
            if len(tokens) > len(path) and tuple(tokens[: len(path)]) == path:
                weights[tokens[len(path)]] = weights.get(tokens[len(path)], 0.0) + weight
        if not weights:
            return path
        best = max(weights.values())
        path += (next(t for t, w in weights.items() if w == best),)


def suffix_candidates(tokens, min_ngram, max_ngram, walk, substitution_walk, depth, match_base, substitution_scale, skip_scale=0.0,
                      source_len=0, first_reach=0, first_only=False):
    """The candidates (continuation, weight) DraftTrie.add_suffix_candidates adds, found by brute force, in the order added."""
    tokens = list(tokens)
    n = len(tokens)
    if n < 2:
        return []

    def agree(end, query_end):  # trailing tokens equal at end and query_end, at most max_ngram
        m = 0
        while m < max_ngram and m <= end and tokens[end - m] == tokens[query_end - m]:
            m += 1
        return m

    def occurrences(query_end):  # earlier ends of the min_ngram-gram ending at query_end, most recent first
        gram = tokens[query_end - min_ngram + 1 : query_end + 1]
        if query_end < min_ngram - 1:
            return []
        return [e for e in range(query_end - 1, min_ngram - 2, -1) if tokens[e - min_ngram + 1 : e + 1] == gram]

    candidates = []
    length, end = longest_match(tokens, min_ngram, max_ngram)
    if length and end < source_len:  # the longest match occurs in the source only: its first occurrence there
        reached = [e for e in occurrences(n - 1)[:first_reach] if agree(e, n - 1) >= length]
        if reached:
            candidates.append((tokens[reached[-1] + 1 : reached[-1] + 1 + depth], match_base**length))
            if first_only and reached[-1] + 1 + depth <= n:
                return candidates
    walked = [(e, agree(e, n - 1)) for e in occurrences(n - 1)[:walk]]
    candidates += [(tokens[e + 1 : e + 1 + depth], match_base**m) for e, m in walked]
    if length and max((m for _, m in walked), default=0) < length:
        candidates.append((tokens[end + 1 : end + 1 + depth], match_base**length))
    for e in occurrences(n - 2)[:substitution_walk]:
        m = agree(e, n - 2)
        if m >= 2 and skip_scale > 0 and e + 2 < n - 1 and tokens[e + 2] == tokens[n - 1]:  # a skipped token
            candidates.append((tokens[e + 3 : e + 3 + depth], skip_scale * match_base**m))
        elif m >= 2:
            candidates.append((tokens[e + 2 : e + 2 + depth], substitution_scale * match_base**m))
    return candidates
