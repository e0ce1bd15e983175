"""`DraftTrie`: weighted continuations merged into a trie; a draft tree is its heaviest nodes.

Each candidate continuation (what followed one occurrence of the current suffix) adds its
weight to every node on its path, so a node's weight is the summed weight of the
candidates that agree with the whole path to it: an estimate of how likely the model
writes that path. Weights only shrink along a path (a child's candidates are a subset of
its parent's), so the `max_tree_nodes` heaviest nodes always form a subtree, and drafting them
maximises the expected accepted tokens under that estimate. The estimate ignores that the
model may leave every candidate; `tree(max_tree_nodes, depth_decay)` prices that in with a
discount per level, which keeps the subtree property.

Buffers (allocated once, grown by the class, never inside a kernel):

    token   int64[cap]    # token[node]; node 0 is the root (the current sequence), token -1
    parent  int64[cap]    # parent[node] < node; -1 for the root
    weight  float64[cap]  # summed weight of the candidates through node
    child   int64[cap]    # first child of node, -1 if none
    sibling int64[cap]    # next child of the same parent, -1 if none; siblings in creation order
    origin  int8[cap]     # origin[node]: the source whose candidate created it (draft.PROMPT, OUTPUT, ...: draft.SOURCES)

A node several sources propose keeps the origin of the first that did (candidates are added the
prompt's first occurrence first, then the request's own occurrences, documents, memory, the
prediction table): what a stats line credits to a source (draft.DraftStats.by_source).

Kernels take the trie as one plain tuple, `trie_group(token=, parent=, weight=, child=, sibling=, eos=,
vocab_limit=, origin=)` (`DraftTrie.arrays`), each field read by its constant (`trie[TRIE_WEIGHT]`): the
buffers, then what no path runs into (the int64 ids `eos`, and any id >= vocab_limit), then the origins;
the index as kernels.py's `index` tuple; a public
kernel's options as a small tuple, named where it unpacks them (the vLLM proposer calls
them so), a private helper's as named scalars. A kernel that adds nodes takes the node
count and returns (or writes to out[0]) the new one.
"""

import numpy as np
from numba import njit

from lookahead.draft import OUTPUT, PREDICTIONS, PROMPT
from lookahead.index import IndexBuffers, TokenIndex, kernels
from lookahead.index.kernels import EMPTY, INDEX_MAX_NGRAM, INDEX_MIN_NGRAM, INDEX_N, INDEX_PREV, INDEX_TOKENS

_warmed_up = False
NO_VOCAB_LIMIT = 2**31  # above every token id (and SEPARATOR)
NO_CORRECTION = (NO_VOCAB_LIMIT, np.zeros(0), np.zeros((2, 1)))  # likeliest_nodes' correction that leaves every estimate as it is
TRIE_TOKEN, TRIE_PARENT, TRIE_WEIGHT, TRIE_CHILD, TRIE_SIBLING, TRIE_EOS, TRIE_VOCAB_LIMIT, TRIE_ORIGIN = range(8)  # the trie's fields


def trie_group(*, token, parent, weight, child, sibling, eos, vocab_limit, origin) -> tuple:
    """The kernels' `trie` tuple, in its constants' order."""
    return (token, parent, weight, child, sibling, eos, vocab_limit, origin)


@njit(cache=True, inline="always")
def _takes(trie, t):
    # Whether a path may run into token t: not an eos id, below vocab_limit (the model cannot take the rest).
    eos, limit = trie[TRIE_EOS], trie[TRIE_VOCAB_LIMIT]
    if t < 0 or t >= limit:
        return False
    for e in range(eos.shape[0]):
        if eos[e] == t:
            return False
    return True


@njit(cache=True, inline="always")
def _child(trie, node, t, count):
    # The child of `node` holding token t, created (appended after its siblings) if missing; returns (child, new count).
    token, parent, weight = trie[TRIE_TOKEN], trie[TRIE_PARENT], trie[TRIE_WEIGHT]
    child, sibling = trie[TRIE_CHILD], trie[TRIE_SIBLING]
    c = child[node]
    last = EMPTY  # the last sibling seen: a new child is appended after it
    while c != EMPTY and token[c] != t:
        last = c
        c = sibling[c]
    if c == EMPTY:
        c = count
        count += 1
        token[c], parent[c], weight[c], child[c], sibling[c] = t, node, 0.0, EMPTY, EMPTY
        if last == EMPTY:
            child[node] = c
        else:
            sibling[last] = c
    return c, count


@njit(cache=True, inline="always")
def _add_path(source, start, stop, w, trie, count, prompt_len):
    # Adds source[start:stop], cut before any token in eos or >= vocab_limit, with weight w; returns the new count.
    # A node it creates has origin PROMPT where its token sits in source[:prompt_len], else OUTPUT.
    weight, origin = trie[TRIE_WEIGHT], trie[TRIE_ORIGIN]
    node = 0
    for pos in range(start, stop):
        t = source[pos]
        if not _takes(trie, t):
            return count
        created = count
        node, count = _child(trie, node, t, count)
        if count > created:
            origin[node] = PROMPT if pos < prompt_len else OUTPUT
        weight[node] += w
    return count


@njit(cache=True)
def add_paths(source, starts, weights, num_draft_tokens, trie, count):
    """Adds candidate i = source[starts[i] : starts[i] + num_draft_tokens] with weight weights[i]; returns the new count.

    The caller guarantees room: count + starts.shape[0] * num_draft_tokens <= token.shape[0].
    Cost: O(len(starts) * num_draft_tokens * branching).
    """
    for i in range(starts.shape[0]):
        stop = min(starts[i] + num_draft_tokens, source.shape[0])
        count = _add_path(source, starts[i], stop, weights[i], trie, count, 0)
    return count


@njit(cache=True, inline="always")
def _add_occurrences(index, query_len, first_end, trie, count, out, walking, prompt_len):
    # Walks the prev chain (kernels.index_ends) from first_end over at most `walk` occurrences
    # of the query tokens[:query_len], most recent first. One whose last m tokens agree with
    # the query's (min_match <= m <= max_ngram) adds tokens[end + shift : end + shift +
    # num_draft_tokens] with weight scale * match_base**m; with skip_scale > 0, where
    # tokens[end + shift] is the sequence's last token (the model skipped tokens[end + 1] and
    # went on copying) it adds the tokens after that instead, with weight skip_scale *
    # match_base**m. Writes (count, longest m added, its end) to out[0:3]. `walking`: (match_base,
    # num_draft_tokens, walk, min_match, shift, scale, skip_scale).
    tokens, prev, n, max_ngram = index[INDEX_TOKENS], index[INDEX_PREV], index[INDEX_N], index[INDEX_MAX_NGRAM]
    match_base, num_draft_tokens, walk, min_match, shift, scale, skip_scale = walking
    best_len, best_end = 0, -1
    end = first_end
    walked = 0
    while end >= 0 and walked < walk:
        m = 0
        while m < max_ngram and m <= end and m < query_len and tokens[end - m] == tokens[query_len - 1 - m]:
            m += 1
        if m >= min_match:
            start, w = end + shift, scale * match_base**m
            if skip_scale > 0.0 and start < n - 1 and tokens[start] == tokens[n - 1]:
                start, w = start + 1, skip_scale * match_base**m
            count = _add_path(tokens, start, min(start + num_draft_tokens, n), w, trie, count, prompt_len)
            if m > best_len:
                best_len, best_end = m, end
        end = prev[end]
        walked += 1
    out[0], out[1], out[2] = count, best_len, best_end


@njit(cache=True, inline="always")
def _oldest_occurrence(index, first_end, length, reach):
    # The oldest of the `reach` occurrences on the prev chain from first_end (most recent
    # first) whose last `length` tokens equal tokens[n - length : n]; -1 if none of them does.
    tokens, prev, n = index[INDEX_TOKENS], index[INDEX_PREV], index[INDEX_N]
    oldest = -1
    end = first_end
    walked = 0
    while end >= 0 and walked < reach:
        m = 0
        while m < length and m <= end and tokens[end - m] == tokens[n - 1 - m]:
            m += 1
        if m == length:
            oldest = end
        end = prev[end]
        walked += 1
    return oldest


@njit(cache=True)
def add_suffix_candidates(index, options, trie, count, ends, out):
    """Adds the continuations of earlier occurrences of the suffix of the index's tokens[:n].

    options = (num_draft_tokens, match_base, walk, substitution_walk, substitution_scale,
    skip_scale, source_len, first_reach, first_only):
    - The source's first occurrence: where the longest match occurs only in
      tokens[:source_len] (the prompt: the model is copying its source), the earliest of
      its occurrences among the `first_reach` most recent occurrences of the last
      min_ngram tokens, weighing match_base**(longest), added first (it wins ties). A
      source is copied from where a text was introduced (the sentence a summary
      restates, a name's first full mention, the line an edit rewrites); the model's own
      text from where it last wrote it (the walk below). With first_only, it is the
      only candidate added when found, unless its continuation runs into the end of
      tokens[:n] before num_draft_tokens (a periodic text: the other occurrences go on).
      first_reach = 0 or source_len = 0: none.
    - Matches: the `walk` most recent occurrences of the last min_ngram tokens, each
      weighing match_base**m for its m-token match; the longest match (the table's,
      kernels.match_ends) is added even when the walk does not reach it.
    - Substitutions: the `substitution_walk` most recent occurrences of the suffix
      without its last token, matching m >= 2 tokens, continued one token later (the
      last token replaced the one that followed them); substitution_scale * match_base**m.
      Where the last token is instead the one after that (the model skipped a token, such
      as a line break of its source), the tokens after it; skip_scale * match_base**m.
    Writes (count, longest match, longest substitution match) to out; `ends` (max_ngram + 1,)
    is scratch. The caller guarantees room for (walk + substitution_walk + 2) * num_draft_tokens nodes.
    Cost: O((walk + substitution_walk) * (max_ngram + num_draft_tokens * branching) + first_reach * max_ngram).
    """
    (num_draft_tokens, match_base, walk, substitution_walk, substitution_scale, skip_scale, source_len, first_reach,
     first_only) = options
    tokens, prev, n, min_ngram = index[INDEX_TOKENS], index[INDEX_PREV], index[INDEX_N], index[INDEX_MIN_NGRAM]
    out[0], out[1], out[2] = count, 0, 0
    if n < 2:
        return
    match_len = kernels.match_ends(index, tokens, n, ends)
    if match_len and ends[match_len] < source_len:  # its most recent occurrence is in the source: all are
        first = _oldest_occurrence(index, ends[min_ngram], match_len, first_reach)
        if first >= 0:
            count = _add_path(tokens, first + 1, min(first + 1 + num_draft_tokens, n), match_base**match_len, trie, count, source_len)
            if first_only and first + 1 + num_draft_tokens <= n:
                out[0], out[1] = count, match_len
                return
    if match_len:
        # matches: continued right after the occurrence (shift 1), at full weight, no skip
        _add_occurrences(index, n, ends[min_ngram], trie, count, out, (match_base, num_draft_tokens, walk, 1, 1, 1.0, 0.0), source_len)
        count = out[0]
        if out[1] < match_len:  # the walk stopped before it (a frequent last token)
            start = ends[match_len] + 1
            count = _add_path(tokens, start, min(start + num_draft_tokens, n), match_base**match_len, trie, count, source_len)
    # substitutions: the suffix without its last token, from the previous occurrence of the gram ending at
    # n - 2 (indexed: only n - 1 is not), 2+ tokens matched, continued one token later (shift 2)
    _add_occurrences(index, n - 1, prev[n - 2], trie, count, out,
                     (match_base, num_draft_tokens, substitution_walk, 2, 2, substitution_scale, skip_scale), source_len)
    out[2] = out[1]
    out[1] = match_len


@njit(cache=True)
def add_longest_match(index, query, options, trie, count, ends, out):
    """Adds what followed the most recent occurrence, in an index, of the longest suffix of `query`.

    options = (num_draft_tokens, match_base, scale, stop_token). The continuation
    tokens[end + 1 : end + 1 + num_draft_tokens] (below n) stops before stop_token (-1: none)
    and before any token in eos or >= vocab_limit; it weighs scale * match_base**m for an
    m-token match. Its new nodes' origin is OUTPUT (the caller labels a store's: engine.chain). Writes (count, m) to out (m = 0: no suffix of at least min_ngram
    tokens occurred). `ends` is scratch. Cost: O(max_ngram) probes, O(num_draft_tokens * branching).
    """
    num_draft_tokens, match_base, scale, stop_token = options
    source, n = index[INDEX_TOKENS], index[INDEX_N]
    match_len = kernels.match_ends(index, query, query.shape[0], ends)
    if match_len:
        start = ends[match_len] + 1
        stop = min(start + num_draft_tokens, n)
        for pos in range(start, stop):
            if source[pos] == stop_token:
                stop = pos
                break
        count = _add_path(source, start, stop, scale * match_base**match_len, trie, count, 0)
    out[0], out[1] = count, match_len


@njit(cache=True, inline="always")
def _heap_before(score, seq, i, j):
    # Heap order: the higher score first, ties to the earlier pushed.
    return score[i] > score[j] or (score[i] == score[j] and seq[i] < seq[j])


@njit(cache=True, inline="always")
def _heap_swap(heap, i, j):
    score, node, token, depth, seq = heap
    score[i], score[j] = score[j], score[i]
    node[i], node[j] = node[j], node[i]
    token[i], token[j] = token[j], token[i]
    depth[i], depth[j] = depth[j], depth[i]
    seq[i], seq[j] = seq[j], seq[i]


@njit(cache=True)
def add_predictions(ids, root_token, chances, options, trie, count, heap):
    """Adds the `budget` likeliest paths of the prediction table from the root, best first; returns the new count.

    ids: (rows, k) int32, ids[t, r] the model's (r+1)-th likeliest token after t (-1: none;
    predictions.PredictionTable). A path t1 t2 ... below the root (whose token is root_token)
    has probability prod_d chances[rank of t_d in the row of t_(d-1)] (chances: (k,) the rank
    keep chances, predictions.RankChances). The `budget` likeliest paths of at most max_depth
    tokens (a path's prefixes are likelier than it, so they come first) each add
    scale * probability to their last node, found or created: where the table agrees with a
    candidate already in the trie, their weights add (a node it creates has origin PREDICTIONS). A node's added weight is at least its
    children's, so weights still only shrink along a path. Paths stop before any eos id or
    id >= vocab_limit (its descendants are not expanded).
    options = (budget, max_depth, scale). heap: (score float64, parent node, token, depth, seq)
    arrays of at least budget * k + k entries. Cost: O(budget * k * log(budget * k) + budget * branching).
    """
    budget, max_depth, scale = options
    weight, origin = trie[TRIE_WEIGHT], trie[TRIE_ORIGIN]
    score, node_of, token_of, depth_of, seq_of = heap
    rows, k = ids.shape
    size = 0
    pushed = 0
    node, depth, p = 0, 0, 1.0  # the entry being expanded: the root first
    t = root_token
    added = 0
    while True:
        if 0 <= t < rows and depth < max_depth:  # push node's children, one per rank
            for r in range(k):
                child_token = ids[t, r]
                if child_token < 0 or chances[r] <= 0.0:
                    continue
                i = size
                score[i], node_of[i], token_of[i], depth_of[i], seq_of[i] = p * chances[r], node, child_token, depth + 1, pushed
                size += 1
                pushed += 1
                while i > 0 and _heap_before(score, seq_of, i, (i - 1) // 2):  # sift up
                    _heap_swap(heap, i, (i - 1) // 2)
                    i = (i - 1) // 2
        if size == 0 or added >= budget:
            return count
        p, parent, t, depth = score[0], node_of[0], token_of[0], depth_of[0]  # pop the likeliest
        size -= 1
        if size > 0:
            _heap_swap(heap, 0, size)
            i = 0
            while True:  # sift down
                best, left = i, 2 * i + 1
                if left < size and _heap_before(score, seq_of, left, best):
                    best = left
                if left + 1 < size and _heap_before(score, seq_of, left + 1, best):
                    best = left + 1
                if best == i:
                    break
                _heap_swap(heap, i, best)
                i = best
        if not _takes(trie, t):
            depth = max_depth  # not added, not expanded
            continue
        created = count
        node, count = _child(trie, parent, t, count)
        if count > created:
            origin[node] = PREDICTIONS
        weight[node] += scale * p
        added += 1


@njit(cache=True)
def heaviest_nodes(trie, count, max_tree_nodes, depth_decay, first_class, out_nodes):
    """Writes the `max_tree_nodes` non-root nodes of highest weight * depth_decay ** level, in creation order, to out_nodes; returns how many.

    Nodes created before `first_class` all rank above the later ones (a later node's parent is
    either earlier or later, an earlier node's parent earlier). With depth_decay <= 1 a child
    never scores above its parent, and ties go to the earlier-created node, so a parent always
    comes before its children: the result is closed under parent. O(count log count).
    """
    parent, weight = trie[TRIE_PARENT], trie[TRIE_WEIGHT]
    if count <= 1:
        return 0
    score = np.empty(count - 1, dtype=np.float64)
    level = np.zeros(count, dtype=np.int64)  # (count,) the root's children are level 1
    for node in range(1, count):  # parent[node] < node: levels in one pass
        level[node] = level[parent[node]] + 1
        score[node - 1] = weight[node] * depth_decay ** level[node]
    if first_class > 1:  # scores are >= 0: lifted above the highest, the earlier nodes all rank first
        score[: min(first_class, count) - 1] += score.max() + 1.0
    order = np.argsort(-score, kind="mergesort")  # stable: equal scores keep creation order
    taken = min(max_tree_nodes, count - 1)
    chosen = np.sort(order[:taken]) + 1
    for i in range(taken):
        out_nodes[i] = chosen[i]
    return taken


@njit(cache=True)
def draft_of_nodes(trie, nodes, taken, where, out_ids, out_parents, out_origin):  # pragma: no cover (compiled)
    """The draft of the trie's nodes[:taken] (a tree: every node's parent among them or the root, parents first):
    out_ids[i] and out_origin[i] node i's token and origin, out_parents[i] its parent's index among them (-1: the
    root). where: a scratch of at least the trie's node count, every entry -1, and left so. O(taken)."""
    token, parent, origin = trie[TRIE_TOKEN], trie[TRIE_PARENT], trie[TRIE_ORIGIN]
    for i in range(taken):
        where[nodes[i]] = i
    for i in range(taken):
        node = nodes[i]
        out_ids[i], out_origin[i] = token[node], origin[node]
        out_parents[i] = where[parent[node]] if parent[node] > 0 else -1
    for i in range(taken):
        where[nodes[i]] = -1


@njit(cache=True)
def likeliest_nodes(trie, count, keep_chance, max_tree_nodes, correction, out_ids, out_chances, out_flags):
    """Writes the `max_tree_nodes` non-root nodes the model likeliest writes the root path of, likeliest first:
    out_ids[0] their tokens, out_ids[1] their parents' indexes among them (-1: the root), out_chances[0] each one's
    estimate and out_chances[1] its chance, out_flags[0] its origin and out_flags[1] 1 where it is the table's
    (created at or after first_class); returns how many.

    A node's estimate is its parent's times the chance that the model's next token after the parent
    is this node's: keep_chance (lookup's, per token: engine.kernels.keep_chance) for the parent's
    heaviest child, the others in proportion to their weight, and the children's together at most
    1. So a chain's j-th token has keep_chance ** j, the chain rule's (sizing.rules.chain_size),
    and a branch is priced by the weight its candidates carry. Its chance is the estimate plus
    what such estimates were off by: correction = (first_class, bands, errors), errors[c, b] for
    the nodes of class c (1: created at or after first_class, the prediction table's; 0: before)
    whose estimate falls in band b (np.searchsorted(bands, estimate, "right")); clipped to [0, 1]
    and to at most its parent's chance (a path is no likelier than its prefix). Ties go to the
    earlier-created node (a parent precedes its children): every prefix of the result is closed
    under parent. O(count log count).
    """
    parent, weight = trie[TRIE_PARENT], trie[TRIE_WEIGHT]
    first_class, bands, errors = correction
    if count <= 1:
        return 0
    total = np.zeros(count, dtype=np.float64)  # (count,) per node, its children's summed weight
    heaviest = np.zeros(count, dtype=np.float64)  # and its heaviest child's
    for node in range(1, count):
        u = parent[node]
        total[u] += weight[node]
        heaviest[u] = max(heaviest[u], weight[node])
    estimate = np.empty(count, dtype=np.float64)
    chance = np.empty(count, dtype=np.float64)
    estimate[0] = chance[0] = 1.0
    for node in range(1, count):  # parent[node] < node: parents first
        u = parent[node]
        share = weight[node] / total[u] if total[u] > 0.0 else 0.0
        estimate[node] = estimate[u] * share * min(1.0, keep_chance * total[u] / heaviest[u]) if heaviest[u] > 0.0 else 0.0
        corrected = estimate[node] + errors[1 if node >= first_class else 0, np.searchsorted(bands, estimate[node], side="right")]
        chance[node] = min(max(corrected, 0.0), chance[u])
    order = np.argsort(-chance[1:], kind="mergesort")  # stable: equal chances keep creation order
    taken = min(max_tree_nodes, count - 1)
    slot = np.full(count, -1, dtype=np.int64)  # trie node -> its index among the taken (-1: not taken; the root)
    token, origin = trie[TRIE_TOKEN], trie[TRIE_ORIGIN]
    for i in range(taken):
        node = order[i] + 1
        out_chances[0, i], out_chances[1, i] = estimate[node], chance[node]
        slot[node] = i  # (its parent, likelier or as likely and created first, is taken before it)
        out_ids[0, i], out_ids[1, i] = token[node], slot[parent[node]]
        out_flags[0, i], out_flags[1, i] = origin[node], 1 if node >= first_class else 0
    return taken


@njit(cache=True)
def heaviest_path(trie, max_len, first_class, out_nodes):
    """Follows the heaviest child from the root (ties: the earliest created), a child created before
    `first_class` over any later one; writes its nodes. Returns the length."""
    weight, child, sibling = trie[TRIE_WEIGHT], trie[TRIE_CHILD], trie[TRIE_SIBLING]
    node = 0
    length = 0
    while length < max_len:
        best, best_early = EMPTY, False
        c = child[node]
        while c != EMPTY:
            early = c < first_class
            if best == EMPTY or early > best_early or (early == best_early and weight[c] > weight[best]):
                best, best_early = c, early
            c = sibling[c]
        if best == EMPTY:
            break
        out_nodes[length] = best
        length += 1
        node = best
    return length


class DraftTrie:
    """A trie of weighted candidate continuations, rebuilt for every draft.

    Example:
        >>> trie = DraftTrie()
        >>> source = np.array([7, 8, 9, 7, 8, 5], dtype=np.int64)
        >>> trie.add(source, np.array([1, 4]), np.array([1.0, 3.0]), num_draft_tokens=2)
        >>> trie.path(4).tolist()  # 8 (weight 4) then 5 (3) beats 9 (1)
        [8, 5]
        >>> ids, parents = trie.tree(max_tree_nodes=2)
        >>> ids.tolist(), parents.tolist()
        ([8, 5], [-1, 0])
    """

    def __init__(self):
        global _warmed_up
        if not _warmed_up:
            _warmed_up = True  # before: warm_up builds a DraftTrie itself
            warm_up()
        self._token = np.zeros(0, dtype=np.int64)  # (cap,) see the module docstring for all six
        self._parent = np.zeros(0, dtype=np.int64)
        self._weight = np.zeros(0, dtype=np.float64)
        self._child = np.zeros(0, dtype=np.int64)
        self._sibling = np.zeros(0, dtype=np.int64)
        self._origin = np.zeros(0, dtype=np.int8)
        self._count = 0
        self._out = np.zeros(3, dtype=np.int64)  # (3,) add_suffix_candidates' results
        self._ends = np.zeros(kernels.MAX_NGRAM + 1, dtype=np.int64)  # (MAX_NGRAM + 1,) its scratch
        self._heap = (np.zeros(0, dtype=np.float64),) + tuple(np.zeros(0, dtype=np.int64) for _ in range(4))  # add_predictions' scratch
        self._eos = np.zeros(0, dtype=np.int64)  # tokens no path runs into
        self._vocab_limit = NO_VOCAB_LIMIT  # nor into ids at or above this (the model's vocabulary size)
        self._arrays = ()  # the kernels' `trie` tuple (module docstring); rebuilt when a buffer, eos or vocab_limit changes
        self.reserve(1024)
        self.clear()

    @property
    def eos(self) -> np.ndarray:
        """Token ids (int64) no path runs into."""
        return self._eos

    @eos.setter
    def eos(self, ids: np.ndarray) -> None:
        self._eos = ids
        self._pack()

    @property
    def vocab_limit(self) -> int:
        """No path runs into an id at or above this (the model's vocabulary size)."""
        return self._vocab_limit

    @vocab_limit.setter
    def vocab_limit(self, limit: int) -> None:
        self._vocab_limit = int(limit)
        self._pack()

    @property
    def arrays(self) -> tuple:
        """The tuple the kernels take (module docstring): the buffers, eos, vocab_limit, origins; stale once the trie grows."""
        return self._arrays

    def _pack(self) -> None:
        self._arrays = trie_group(token=self._token, parent=self._parent, weight=self._weight, child=self._child,
                                  sibling=self._sibling, eos=self._eos, vocab_limit=self._vocab_limit, origin=self._origin)

    def __len__(self) -> int:
        """Nodes, the root excluded."""
        return self._count - 1

    def filled(self, count: int) -> None:
        """Takes the node count, the root included, of a kernel that rebuilt the trie from its root through `arrays`
        (engine.chain's)."""
        self._count = count

    def clear(self) -> None:
        self._token[0], self._parent[0], self._weight[0] = -1, -1, 0.0
        self._child[0], self._sibling[0] = EMPTY, EMPTY
        self._count = 1

    def add(self, source: np.ndarray, starts: np.ndarray, weights: np.ndarray, num_draft_tokens: int) -> None:
        """Adds the continuations source[start : start + num_draft_tokens], one per start (int64), with their weights (float64)."""
        if starts.shape[0] == 0 or num_draft_tokens <= 0:
            return
        self.reserve(self._count + starts.shape[0] * num_draft_tokens)
        self._count = add_paths(source, starts, weights, num_draft_tokens, self._arrays, self._count)

    def add_suffix_candidates(self, index: IndexBuffers, num_draft_tokens: int, *, walk: int, substitution_walk: int,
                              match_base: float, substitution_scale: float, skip_scale: float = 0.0, source_len: int = 0,
                              first_reach: int = 0, first_only: bool = False) -> tuple[int, int]:
        """Adds the continuations of the current suffix of `index` (TokenIndex.buffers(); see the kernel of that name).

        `source_len`: the index's first tokens that are the source (the prompt), 0 for none.
        Returns (longest match_len, longest substitution match_len); 0 where none.
        """
        self.reserve(self._count + (walk + substitution_walk + 2) * max(num_draft_tokens, 0))
        options = (num_draft_tokens, match_base, walk, substitution_walk, substitution_scale, skip_scale, source_len,
                   first_reach, first_only)
        add_suffix_candidates(tuple(index), options, self._arrays, self._count, self._ends, self._out)
        self._count = int(self._out[0])
        return int(self._out[1]), int(self._out[2])

    def add_longest_match(self, index: IndexBuffers, query: np.ndarray, num_draft_tokens: int, *, match_base: float,
                          scale: float = 1.0, stop_token: int | None = None) -> int:
        """Adds what followed the longest suffix of `query` (1-D int32/int64 ids) in another index
        (TokenIndex.buffers()); returns its match_len.

        The continuation also stops before `stop_token` (a store's sequence separator).
        """
        self.reserve(self._count + max(num_draft_tokens, 0))
        options = (num_draft_tokens, match_base, scale, -1 if stop_token is None else stop_token)
        add_longest_match(tuple(index), query, options, self._arrays, self._count, self._ends, self._out)
        self._count = int(self._out[0])
        return int(self._out[1])

    def nodes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(token ids, parent indices, weights) of every node, root excluded, in creation order
        (parents precede children, -1 is the root): the trie as drafts see it, for inspection."""
        parents = self._parent[1 : self._count] - 1  # node i + 1 is entry i; the root (node 0) becomes -1
        return self._token[1 : self._count].copy(), parents, self._weight[1 : self._count].copy()

    def path(self, max_len: int) -> np.ndarray:
        """The heaviest root path, at most max_len tokens (int64)."""
        return self.path_tokens(self.path_nodes(max_len))

    def path_tokens(self, nodes: np.ndarray) -> np.ndarray:
        """The tokens of `nodes` (int64, a copy)."""
        return self._token[nodes]

    def path_nodes(self, max_len: int, *, first_class: int = 0) -> np.ndarray:
        """The nodes of the heaviest root path, at most max_len (int64; node i was the i-th created, the root 0);
        nodes created before `first_class` go before any later one at each branch."""
        out = np.empty(max(max_len, 0), dtype=np.int64)
        return out[: heaviest_path(self._arrays, max_len, first_class, out)]

    def add_predictions(self, ids: np.ndarray, root_token: int, chances: np.ndarray, *, budget: int, max_depth: int,
                        scale: float) -> None:
        """Adds the `budget` likeliest paths of a prediction table (PredictionTable.ids) from `root_token`, each
        weighing scale * its probability under the rank `chances` (see the kernel of that name)."""
        if budget <= 0 or max_depth <= 0 or ids.shape[0] == 0:
            return
        self.reserve(self._count + budget)
        self._count = add_predictions(ids, root_token, chances, (budget, max_depth, float(scale)), self._arrays, self._count,
                                      self.heap(budget * ids.shape[1] + ids.shape[1]))

    def heap(self, entries: int) -> tuple:
        """add_predictions' heap, at least `entries` long (budget * k + k for `budget` paths of a (rows, k) table)."""
        if self._heap[0].shape[0] < entries:
            self._heap = (np.zeros(entries, dtype=np.float64),) + tuple(np.zeros(entries, dtype=np.int64) for _ in range(4))
        return self._heap

    def tree(self, max_tree_nodes: int, depth_decay: float = 1.0, *, first_class: int = 0, origins: bool = False) -> tuple:
        """(token ids, parent indices) of the max_tree_nodes heaviest nodes, each node's weight
        discounted by depth_decay (<= 1) per level, the nodes created before `first_class` first;
        parents precede children, -1 is the root. `origins`: their origins too, a third array."""
        if not 0.0 < depth_decay <= 1.0:
            raise ValueError(f"depth_decay must be in (0, 1], got {depth_decay}")
        nodes = np.empty(max(max_tree_nodes, 0), dtype=np.int64)
        taken = heaviest_nodes(self._arrays, self._count, max_tree_nodes, depth_decay, first_class, nodes)
        ids, parents, origin = np.empty(taken, dtype=np.int64), np.empty(taken, dtype=np.int64), np.empty(taken, dtype=np.int8)
        draft_of_nodes(self._arrays, nodes, taken, np.full(self._count, -1, dtype=np.int64), ids, parents, origin)
        return (ids, parents, origin) if origins else (ids, parents)

    def likeliest(self, max_tree_nodes: int, keep_chance: float, correction=None) -> tuple[np.ndarray, ...]:
        """(token ids, parent indices, chances, estimates, table) of the max_tree_nodes nodes the model likeliest
        writes the root path of, likeliest first (see the kernel likeliest_nodes; `correction` its (first_class,
        bands, errors), None: chances are the estimates): every prefix is a tree, parents before children, -1 the
        root; `table` (bool) marks the nodes created at or after first_class; then their origins (int8)."""
        correction = NO_CORRECTION if correction is None else correction
        n = max(max_tree_nodes, 0)
        ids, chances, flags = np.empty((2, n), dtype=np.int64), np.empty((2, n), dtype=np.float64), np.empty((2, n), dtype=np.int8)
        taken = likeliest_nodes(self._arrays, self._count, float(keep_chance), max_tree_nodes, correction, ids, chances, flags)
        return ids[0, :taken], ids[1, :taken], chances[1, :taken], chances[0, :taken], flags[1, :taken].view(np.bool_), flags[0, :taken]

    def reserve(self, capacity: int) -> None:
        """Room for `capacity` nodes, the root included (`arrays` is rebuilt where the buffers grow)."""
        if capacity <= self._token.shape[0]:
            return
        capacity = max(capacity, 2 * self._token.shape[0])
        for name in ("_token", "_parent", "_child", "_sibling", "_weight", "_origin"):
            old = getattr(self, name)
            grown = np.zeros(capacity, dtype=old.dtype)
            grown[: old.shape[0]] = old
            setattr(self, name, grown)
        self._pack()


def warm_up() -> int:
    """Compiles every kernel the drafter calls on a small real input; returns the tree size (4 when all ran).

    The sources are int32 (an index's tokens) and int64 (a store's continuation).
    """
    index = TokenIndex(min_ngram=1, max_ngram=4)
    index.extend([4, 5, 4, 6, 9, 4])
    buffers = index.buffers()
    trie = DraftTrie()
    trie.add_suffix_candidates(buffers, 2, walk=4, substitution_walk=4, match_base=2.0, substitution_scale=0.5, skip_scale=1.0,
                               source_len=6, first_reach=4)
    trie.add(np.array([4, 7, 8], dtype=np.int64), np.array([1]), np.array([1.0]), 2)
    trie.add(buffers.tokens, np.array([1]), np.array([1.0]), 2)
    trie.add_longest_match(buffers, buffers.tokens[:3], 2, match_base=2.0, stop_token=9)
    trie.add_longest_match(buffers, np.array([4, 5]), 2, match_base=2.0)
    trie.path(2)
    table = np.array([[1, 2], [2, -1], [0, 1]], dtype=np.int32)  # a prediction table's ids
    trie.add_predictions(table, 0, np.array([0.5, 0.25]), budget=3, max_depth=2, scale=2.0)
    trie.likeliest(4, 0.5)
    return trie.tree(4)[0].shape[0]
