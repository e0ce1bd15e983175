"""`TreeRows`: the trees of a batch's rows (lookahead.generate's tree batches), drafted for every row in one kernel call.

A row's tree is the one LookupDrafter drafts for one request (propose(hedged=True), then _grow_tree; or propose_tree):
its candidates (engine.chain.add_lookup_candidates with policy.TREE_WALK's walks) and the prediction table's
likeliest paths (trie.add_predictions, weighed on lookup's scale by the row's lead and rank chances) in a trie of
its own; the hedged chain (the trie's heaviest path, lookup's nodes first, cut to draft_factor x its anchor) sizes
the step; its heaviest nodes (trie.heaviest_nodes) are the tree. A step:

    batch.advance_trees(tree_rows, table)     every row learnt from its last step and indexed (kernels.advance),
                                              its trie filled and hedged chain drafted (draft_trees): the chains in
                                              the batch's out buffers, as advance leaves its chains
    ... size the chains, batch.commit ...
    tree_rows.grow(nodes)                     each row's tree of its nodes[r] heaviest nodes (grow_trees)
    ... verify ...
    tree_rows.observe(...)                    what the rows wrote, counted into their lead and rank chances
                                              (before the step's predictions are recorded into the table)

Arrays (per row r of the step; the chances' per row of the call, read through `row`):

    token, parent, child, sibling  int64[R, C]   row r's trie (trie.py's buffers, row by row), C its most nodes
    weight                         float64[R, C]
    origin                         int8[R, C]
    eos                            int64[E]      ids no path runs into (and any id >= vocab_limit)
    count, first_class             int64[R]      nodes of row r's trie (the root included), of them lookup's
    hits, seen                     float64[N, M + 1]  row's LeadChances counts (predictions.lead_chance)
    pending                        int64[N, 2]   (match length, token) of its lead being verified; match -1: none
    ranks                          float64[N, k + 1]  its RankChances counts (predictions.rank_chances)
    read                           bool[N]       whether its last draft read the table
"""

import math

import numpy as np
from numba import njit

from lookahead.engine.chain import add_lookup_candidates, lookup_nodes
from lookahead.engine.groups import (OPTIONS_DRAFT_FACTOR, OPTIONS_MAX_NGRAM, OPTIONS_MIN_NGRAM,
                                     OUT_IDS, OUT_LEN, OUT_MATCH, OUT_ORIGIN, ROWS_NUM_TOKENS, ROWS_ROOM,
                                     ROWS_SLOT, SLOTS_COLS, lookup_group, stores_group)
from lookahead.engine.kernels import PROMPT_LEN, row_indexes
from lookahead.index.kernels import INDEX_TOKENS, MAX_NGRAM
from lookahead.policy import FIRST_REACH, PREDICTION_SCALE, PREDICTION_TREE_NODES, TREE_DEPTH_DECAY, TREE_WALK
from lookahead.predictions import lead_chance, lead_written, rank_chances, rank_counts, rank_prior
from lookahead.trie import (NO_VOCAB_LIMIT, TRIE_ORIGIN, TRIE_TOKEN, TRIE_WEIGHT, add_predictions, draft_of_nodes, heaviest_nodes,
                            heaviest_path)

# the trees group's fields (TreeRows.arrays), each read by its constant
(TREES_TOKEN, TREES_PARENT, TREES_WEIGHT, TREES_CHILD, TREES_SIBLING, TREES_ORIGIN, TREES_EOS, TREES_VOCAB_LIMIT,
 TREES_COUNT, TREES_FIRST_CLASS, TREES_ROW, TREES_HITS, TREES_SEEN, TREES_PENDING, TREES_RANKS, TREES_PRIOR, TREES_READ,
 TREES_HEAP, TREES_ENDS, TREES_SCRATCH) = range(20)


@njit(cache=True, inline="always")
def _row_trie(trees, r):
    # row r's trie as trie.py's tuple (trie_group's order)
    return (trees[TREES_TOKEN][r], trees[TREES_PARENT][r], trees[TREES_WEIGHT][r], trees[TREES_CHILD][r],
            trees[TREES_SIBLING][r], trees[TREES_EOS], trees[TREES_VOCAB_LIMIT], trees[TREES_ORIGIN][r])


@njit(cache=True)
def draft_trees(rows, slots, arena, docs, memory, options, table, trees, out):
    """Each row's tree candidates and hedged chain, as LookupDrafter.propose(hedged=True) drafts them for one request.

    Per row r with room[r] > 0 (slot s = rows_slot[r]): the slot's index takes its tokens not yet indexed;
    add_lookup_candidates fills row r's trie (TREE_WALK, the prompt's first occurrence beside the rest); where the
    table has rows (table: PredictionTable.ids, (0, k) where there is none: with k = 0, no prediction is read), its
    PREDICTION_TREE_NODES likeliest paths from the row's last token are added, each weighing PREDICTION_SCALE x its
    probability (the row's rank chances) x w / c (lookup's heaviest first token's weight over the row's lead chance
    at the anchor; 1 without lookup candidates), and that first token is held to be verified (pending). The hedged
    chain, the trie's heaviest path with lookup's nodes first, goes to out ids/origin/len/match as advance's chains
    do: cut to ceil(draft_factor x anchor) tokens, or where the table leads (lookup has no candidate) anchored on 0.
    count[r], first_class[r]: the trie's nodes, lookup's. The caller ran kernels.advance for the step's learning (its
    rows drafting nothing) and grew every slot (Batch.advance_trees). Cost: LookupDrafter.propose(hedged=True)'s a row.
    """
    min_ngram, max_ngram, draft_factor = options[OPTIONS_MIN_NGRAM], options[OPTIONS_MAX_NGRAM], options[OPTIONS_DRAFT_FACTOR]
    rows_slot, num_tokens, room = rows[ROWS_SLOT], rows[ROWS_NUM_TOKENS], rows[ROWS_ROOM]
    cols = slots[SLOTS_COLS]
    count, first_class, row_of = trees[TREES_COUNT], trees[TREES_FIRST_CLASS], trees[TREES_ROW]
    hits, seen, pending, ranks, prior, read = (trees[TREES_HITS], trees[TREES_SEEN], trees[TREES_PENDING], trees[TREES_RANKS],
                                               trees[TREES_PRIOR], trees[TREES_READ])
    heap, ends, scratch = trees[TREES_HEAP], trees[TREES_ENDS], trees[TREES_SCRATCH]
    out_ids, out_origin, out_len, out_match = out[OUT_IDS], out[OUT_ORIGIN], out[OUT_LEN], out[OUT_MATCH]
    chances = np.zeros(prior.shape[0], dtype=np.float64)
    path = np.zeros(out_ids.shape[1], dtype=np.int64)
    for r in range(rows_slot.shape[0]):
        s, n, limit, row = rows_slot[r], num_tokens[r], room[r], row_of[r]
        count[r], first_class[r], out_len[r], out_match[r], read[row] = 1, 1, 0, 0, False
        if limit <= 0 or n < 1:
            continue
        index, documents = row_indexes(arena, docs, cols, s, n, min_ngram, max_ngram)
        tok = index[INDEX_TOKENS]
        lookup = lookup_group(num_draft_tokens=limit, prompt_len=cols[s, PROMPT_LEN], walk=TREE_WALK[0],
                              substitution_walk=TREE_WALK[1], first_reach=FIRST_REACH, first_only=False,
                              draft_factor=draft_factor)
        trie = _row_trie(trees, r)
        anchor = add_lookup_candidates(index, stores_group(documents=documents, memory=memory), lookup,
                                       (trie, ends, scratch))  # work_group's order
        first = scratch[0]
        read[row] = prior.shape[0] > 0
        predicted = (table, tok[n - 1], hits[row], seen[row], ranks[row], prior, chances, heap)
        c, length, match, lead = hedged_chain(trie, first, anchor, predicted,
                                              (limit, PREDICTION_TREE_NODES if read[row] else 0, draft_factor), path,
                                              out_ids[r], out_origin[r])
        if lead >= 0:
            pending[row, 0], pending[row, 1] = min(anchor, hits.shape[1] - 1), lead
        count[r], first_class[r] = c, first
        if length:
            out_len[r], out_match[r] = length, match


@njit(cache=True)
def hedged_chain(trie, first, anchor, predicted, options, path, out_ids, out_origin):
    """The prediction table's candidates added to a trie add_lookup_candidates filled (`first` nodes, the root
    included; `anchor` its anchor), and the hedged chain drawn from them: LookupDrafter.propose's and draft_trees' row's.

    predicted = (table, root_token, hits, seen, ranks, prior, chances, heap): the table's ids ((0, k): no rows), the
    request's last token, its lead chances' counts, its rank counts and prior, a (k,) scratch and add_predictions' heap;
    options = (limit, budget, draft_factor). With budget > 0 (the draft reads the table): lookup's heaviest first
    token, if any, weighs w and is kept with chance c (predictions.lead_chance at the anchor), and the table's
    `budget` likeliest paths from root_token (at most limit deep) each weigh PREDICTION_SCALE x its probability under
    the rank chances x w / c (1 without lookup candidates). The chain: the trie's heaviest path of at most `limit`
    tokens, lookup's nodes first; cut to ceil(draft_factor x anchor) tokens, or, where the table leads (lookup has no
    candidate), anchored on 0. Writes its ids and sources to out_ids, out_origin (path: a scratch of limit nodes).
    Returns (the trie's nodes, the chain's length, its anchor, lookup's heaviest first token where the table was
    weighed against it, else -1). Cost: add_predictions' and O(limit * branching)."""
    table, root_token, hits, seen, ranks, prior, chances, heap = predicted
    limit, budget, draft_factor = options
    token, origin = trie[TRIE_TOKEN], trie[TRIE_ORIGIN]
    count, lead = first, -1
    if budget > 0:
        scale = PREDICTION_SCALE
        if count > 1:  # lookup's heaviest first token weighs w and is kept with chance c: a probability p weighs p * w / c
            heaviest_path(trie, 1, 0, path)
            scale *= trie[TRIE_WEIGHT][path[0]] / lead_chance(hits, seen, anchor)
            lead = token[path[0]]
        if table.shape[0]:
            rank_chances(ranks, prior, chances)
            count = add_predictions(table, root_token, chances, (budget, limit, scale), trie, count, heap)
    length = heaviest_path(trie, limit, first, path)
    match = anchor
    if length and path[0] >= first:  # the table leads (lookup has no candidate): anchored on no match
        match = 0
    else:
        length = min(length, math.ceil(draft_factor * anchor))
    for i in range(length):
        out_ids[i] = token[path[i]]
        out_origin[i] = origin[path[i]]
    return count, length, match, lead


@njit(cache=True)
def grow_trees(trees, nodes, lookup_first, out_ids, out_parents, out_origin, out_len):
    """Row r's tree: the nodes[r] heaviest nodes of its trie (trie.heaviest_nodes, TREE_DEPTH_DECAY per level; with
    lookup_first, lookup's nodes before the table's, as a sized step's _grow_tree; else blended, as propose_tree),
    parents before children: their ids, parents (indexes into the row's tree, -1 the root) and sources, out_len[r]
    of them."""
    count, first_class = trees[TREES_COUNT], trees[TREES_FIRST_CLASS]
    chosen = np.zeros(out_ids.shape[1], dtype=np.int64)
    where = np.full(trees[TREES_TOKEN].shape[1], -1, dtype=np.int64)  # a trie node's index in its row's tree
    for r in range(nodes.shape[0]):
        trie = _row_trie(trees, r)
        taken = heaviest_nodes(trie, count[r], min(nodes[r], chosen.shape[0]), TREE_DEPTH_DECAY,
                               first_class[r] if lookup_first else 0, chosen)
        draft_of_nodes(trie, chosen, taken, where, out_ids[r], out_parents[r], out_origin[r])
        out_len[r] = taken


@njit(cache=True)
def observe_trees(trees, table, token_ids, num_tokens, num_sampled):
    """What each row wrote this step (its last num_sampled[r] of token_ids[r, :num_tokens[r]]): its pending lead
    counted kept or not (predictions.lead_written), and, where its draft read the table, each written token's rank
    in the table's row for the token before it (predictions.rank_counts; call before the step records its own)."""
    row_of, hits, seen, pending, ranks, read = (trees[TREES_ROW], trees[TREES_HITS], trees[TREES_SEEN], trees[TREES_PENDING],
                                                trees[TREES_RANKS], trees[TREES_READ])
    for r in range(num_tokens.shape[0]):
        row, n = row_of[r], num_tokens[r]
        start = n - num_sampled[r]
        if num_sampled[r] < 1:
            continue
        if pending[row, 0] >= 0:
            lead_written(hits[row], seen[row], pending[row, 0], 1.0 if token_ids[r, start] == pending[row, 1] else 0.0)
            pending[row, 0] = -1
        if read[row] and start > 0 and table.shape[0]:
            rank_counts(table, token_ids[r, :n], start, ranks[row])


class TreeRows:
    """The tries of a batch's rows and each row's lead and rank chances; the rows' trees.

    Args:
        rows: rows of the call (each keeps its chances for the call's life).
        num_draft_tokens: the most tokens a candidate holds (the chains' room).
        max_ngram: the longest anchor the lead chances tell apart.
        eos, vocab_limit: ids no path runs into (int64 ids, and any id >= vocab_limit; None: no limit).
        k: the prediction table's ranks (0: no table: only lookup's candidates).
        carry: the lead and rank counts every row starts from ((hits, seen), ranks; None: none), a
            LookupDrafter's at drafter.CARRY of themselves.
    """

    def __init__(self, rows: int, num_draft_tokens: int, max_ngram: int, eos: np.ndarray, vocab_limit: int | None, k: int,
                 carry=None):
        cap = lookup_nodes(num_draft_tokens, *TREE_WALK) + (PREDICTION_TREE_NODES if k else 0)  # a row's trie's most nodes
        self.token, self.parent = np.zeros((rows, cap), dtype=np.int64), np.zeros((rows, cap), dtype=np.int64)
        self.child, self.sibling = np.zeros((rows, cap), dtype=np.int64), np.zeros((rows, cap), dtype=np.int64)
        self.weight, self.origin = np.zeros((rows, cap), dtype=np.float64), np.zeros((rows, cap), dtype=np.int8)
        self.count, self.first_class = np.ones(rows, dtype=np.int64), np.ones(rows, dtype=np.int64)
        self.hits = np.zeros((rows, max_ngram + 1), dtype=np.float64)
        self.seen = np.zeros((rows, max_ngram + 1), dtype=np.float64)
        self.ranks = np.zeros((rows, k + 1), dtype=np.float64)
        if carry is not None:
            (hits, seen), ranks = carry
            self.hits[:], self.seen[:] = hits, seen
            if ranks is not None:
                self.ranks[:] = ranks
        self.pending = np.full((rows, 2), -1, dtype=np.int64)
        self.read = np.zeros(rows, dtype=np.bool_)
        self.row = np.arange(rows, dtype=np.int64)  # step row -> row of the call (keep)
        self._eos, self._limit = np.asarray(eos, dtype=np.int64), NO_VOCAB_LIMIT if vocab_limit is None else int(vocab_limit)
        self._prior = rank_prior(k)
        entries = PREDICTION_TREE_NODES * k + k  # add_predictions' heap
        self._heap = (np.zeros(entries, dtype=np.float64),) + tuple(np.zeros(entries, dtype=np.int64) for _ in range(4))
        self._ends, self._scratch = np.zeros(MAX_NGRAM + 1, dtype=np.int64), np.zeros(3, dtype=np.int64)

    def arrays(self) -> tuple:
        """The kernels' `trees` group, in the TREES_ constants' order."""
        return (self.token, self.parent, self.weight, self.child, self.sibling, self.origin, self._eos, self._limit,
                self.count, self.first_class, self.row, self.hits, self.seen, self.pending, self.ranks, self._prior,
                self.read, self._heap, self._ends, self._scratch)

    def keep(self, going: list[int]) -> None:
        """Only the step rows `going` (indexes into the rows before) take further steps."""
        self.row = self.row[going]

    def grow(self, nodes: np.ndarray, max_tree_nodes: int, *, lookup_first: bool) -> tuple[np.ndarray, ...]:
        """Each step row's tree of at most nodes[r] nodes (see grow_trees): (ids, parents, origins, lengths)."""
        rows = nodes.shape[0]
        ids, parents = np.zeros((rows, max_tree_nodes), dtype=np.int64), np.zeros((rows, max_tree_nodes), dtype=np.int64)
        origins, lengths = np.zeros((rows, max_tree_nodes), dtype=np.int8), np.zeros(rows, dtype=np.int64)
        grow_trees(self.arrays(), nodes, lookup_first, ids, parents, origins, lengths)
        return ids, parents, origins, lengths

    def observe(self, table: np.ndarray, token_ids: np.ndarray, num_tokens: np.ndarray, num_sampled: np.ndarray) -> None:
        """What the step rows wrote, counted (observe_trees); before the step's predictions are recorded."""
        observe_trees(self.arrays(), table, token_ids, num_tokens, num_sampled)
