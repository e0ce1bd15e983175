"""A draft's lookup candidates and its chain, written once: the kernels LookupDrafter and engine.kernels.advance call.

`add_lookup_candidates` rebuilds a candidate trie from the request's index and its stores (the policy's weights,
lookahead.policy); `draft_chain` takes its heaviest path, cut to the anchor's length times draft_factor. They take
the groups engine.groups lays out: the request's index tuple (index/kernels.py's), `stores` (the documents store's
and memory's index tuples; NO_STORE where there is none), `lookup` (the options), `work` (the trie and scratch).
A LookupDrafter passes its own trie, index and stores (`propose`); `advance` a row's slot and the batch's stores.
"""

import math

import numpy as np
from numba import njit

from lookahead.engine.groups import (LOOKUP_DRAFT_FACTOR, LOOKUP_FIRST_ONLY, LOOKUP_FIRST_REACH, LOOKUP_NUM_DRAFT_TOKENS,
                                     LOOKUP_PROMPT_LEN, LOOKUP_SUBSTITUTION_WALK, LOOKUP_WALK, STORES_DOCUMENTS, STORES_MEMORY,
                                     WORK_ENDS, WORK_SCRATCH, WORK_TRIE)
from lookahead.index import SEPARATOR
from lookahead.index.kernels import EMPTY, INDEX_MAX_NGRAM, INDEX_N, INDEX_TOKENS, index_group
from lookahead.policy import MATCH_BASE, SKIP_SCALE, STORE_SCALE, SUBSTITUTION_SCALE
from lookahead.sources import DOCUMENTS, MEMORY
from lookahead.trie import (TRIE_CHILD, TRIE_ORIGIN, TRIE_PARENT, TRIE_SIBLING, TRIE_TOKEN, TRIE_WEIGHT, add_longest_match,
                            add_suffix_candidates, heaviest_path)

# An index tuple holding no token: a store that is absent (one that holds none is not read either)
NO_STORE = index_group.py_func(tokens=np.zeros(0, dtype=np.int32), prev=np.zeros(0, dtype=np.int32),
                               table=np.zeros(0, dtype=np.int32), n=0, min_ngram=1, max_ngram=1)


def lookup_nodes(num_draft_tokens: int, walk: int, substitution_walk: int) -> int:
    """The most nodes add_lookup_candidates' trie holds, the root included: add_suffix_candidates' bound, and 2 stores'."""
    return 1 + (walk + substitution_walk + 4) * max(num_draft_tokens, 0)


@njit(cache=True, inline="always")
def _add_store(store, source, query, num_draft_tokens, trie, count, ends, scratch):
    # store's longest match of the query's suffix (n = 0: not read), its new nodes' origin `source`; (count, its match_len)
    if store[INDEX_N] == 0:
        return count, 0
    add_longest_match(store, query, (num_draft_tokens, MATCH_BASE, STORE_SCALE, SEPARATOR), trie, count, ends, scratch)
    trie[TRIE_ORIGIN][count : scratch[0]] = source
    return scratch[0], scratch[1]


@njit(cache=True)
def add_lookup_candidates(index, stores, lookup, work):
    """Rebuilds work's trie from the root with lookup's candidates for the suffix of the index's tokens[:n].

    First add_suffix_candidates' (the request's own occurrences: lookup's walks, prompt_len, first_reach,
    first_only); then, where the request's longest match is shorter than max_ngram - 1 (else no store's match can
    outweigh it), each store's longest match of the request's last max_ngram tokens (trie.add_longest_match, weighing
    STORE_SCALE as much, cut at its sequence's end): the documents store's, then memory's, their new nodes' origin
    DOCUMENTS and MEMORY. A store whose index holds no token (NO_STORE) is not read. Paths stop before the trie's
    eos ids and ids >= its vocab_limit. Writes (nodes, the root included; longest match; longest substitution
    match) to work's scratch and returns the anchor: the longer match if any candidate was added, else 0.
    The trie holds lookup_nodes(num_draft_tokens, walk, substitution_walk) nodes. Cost: add_suffix_candidates',
    and O(max_ngram + num_draft_tokens) a store.
    """
    trie, ends, scratch = work[WORK_TRIE], work[WORK_ENDS], work[WORK_SCRATCH]
    num_draft_tokens = lookup[LOOKUP_NUM_DRAFT_TOKENS]
    token, parent, weight, child, sibling = trie[TRIE_TOKEN], trie[TRIE_PARENT], trie[TRIE_WEIGHT], trie[TRIE_CHILD], trie[TRIE_SIBLING]
    token[0], parent[0], weight[0], child[0], sibling[0] = -1, -1, 0.0, EMPTY, EMPTY
    add_suffix_candidates(index, (num_draft_tokens, MATCH_BASE, lookup[LOOKUP_WALK], lookup[LOOKUP_SUBSTITUTION_WALK],
                                  SUBSTITUTION_SCALE, SKIP_SCALE, lookup[LOOKUP_PROMPT_LEN], lookup[LOOKUP_FIRST_REACH],
                                  lookup[LOOKUP_FIRST_ONLY]), trie, 1, ends, scratch)
    count, match_len, substituted = scratch[0], scratch[1], scratch[2]
    n, max_ngram = index[INDEX_N], index[INDEX_MAX_NGRAM]
    if match_len < max_ngram - 1:
        query = index[INDEX_TOKENS][max(0, n - max_ngram) : n]  # what the stores are asked for
        count, store_len = _add_store(stores[STORES_DOCUMENTS], DOCUMENTS, query, num_draft_tokens, trie, count, ends, scratch)
        match_len = max(match_len, store_len)
        count, store_len = _add_store(stores[STORES_MEMORY], MEMORY, query, num_draft_tokens, trie, count, ends, scratch)
        match_len = max(match_len, store_len)
    scratch[0], scratch[1], scratch[2] = count, match_len, substituted
    return max(match_len, substituted) if count > 1 else 0


@njit(cache=True)
def draft_chain(index, stores, lookup, work, out_ids, out_origin):
    """A request's chain (LookupDrafter.propose's, a row's of advance): the heaviest path of add_lookup_candidates'
    trie (ties: the earliest created child), at most min(num_draft_tokens, ceil(draft_factor * anchor)) tokens.

    Writes its token ids to out_ids and their sources (the origins of its nodes) to out_origin, both at least
    num_draft_tokens long; work's scratch as add_lookup_candidates leaves it. Returns (length, anchor).
    Cost: add_lookup_candidates', and O(num_draft_tokens * branching) for the path.

    Example:
        >>> from lookahead.engine.groups import lookup_group, stores_group, work_group
        >>> from lookahead.index import TokenIndex
        >>> from lookahead.trie import DraftTrie
        >>> index = TokenIndex(min_ngram=1, max_ngram=4)
        >>> index.extend([1, 2, 3, 4, 1, 2])
        >>> trie = DraftTrie()
        >>> trie.reserve(lookup_nodes(3, 8, 4))
        >>> work = work_group(trie=trie.arrays, ends=np.zeros(17, dtype=np.int64), scratch=np.zeros(3, dtype=np.int64))
        >>> lookup = lookup_group.py_func(num_draft_tokens=3, prompt_len=0, walk=8, substitution_walk=4, first_reach=64,
        ...                               first_only=True, draft_factor=16.0)
        >>> ids, origin = np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int8)
        >>> draft_chain(tuple(index.buffers()), stores_group.py_func(NO_STORE, NO_STORE), lookup, work, ids, origin)
        (3, 2)
        >>> ids.tolist()
        [3, 4, 1]
    """
    anchor = add_lookup_candidates(index, stores, lookup, work)
    trie = work[WORK_TRIE]
    token, origin = trie[TRIE_TOKEN], trie[TRIE_ORIGIN]
    length = heaviest_path(trie, min(lookup[LOOKUP_NUM_DRAFT_TOKENS], math.ceil(lookup[LOOKUP_DRAFT_FACTOR] * anchor)), 0, out_ids)
    for i in range(length):  # out_ids holds the path's nodes: their tokens and sources
        out_origin[i] = origin[out_ids[i]]
        out_ids[i] = token[out_ids[i]]
    return length, anchor
