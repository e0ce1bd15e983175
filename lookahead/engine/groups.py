"""The argument groups of the engine's kernels (engine.kernels, engine.chain): plain tuples, each field read by its constant.

A kernel reads `rows[ROWS_NUM_TOKENS]`, never unpacks a group by position; each group is built by its
function below, which names every field (`rows_group(slot=..., num_tokens=..., ...)`) and returns them in the
constants' order (tests/engine/test_groups.py checks that they agree). Plain tuples, as index/kernels.py's index
tuple is (that docstring says why; the constants cost nothing at run time). The groups a kernel builds itself
(lookup, stores: per row) have njit builders, called in Python through `.py_func`, as index_group is.

    arena  (IndexArena.arrays(): the token indexes of many entries; engine.arena lays its arrays out)
      tokens, prev, table, at
    docs  (DocumentStores.arrays(): the documents stores, entry d = store d)
      arena      the arena group       the stores' indexes
      n          int64[D]              tokens store d holds
    slots  (Slots.state(): per slot s, one per live request; the arena's entry s is its index)
      cols       int64[S, NUM_COLS]    engine.kernels' columns COPIED ... LAST_CHANCE
      keep       float64[S, M + 1, 2]  per anchor length m: faded (kept tokens, failures): the keep rate
      overall    float64[S, 2]         faded (kept, failed) over every length, prior (1, 1)
      plan_ids   int32[S, K]           the pending chain (cols[s, PLAN_LEN] tokens)
      watch      int64[S, W, 5]        rests of chains past what was verified, oldest first (learn_row):
                                         watch[s, 0, 0] the count; watch[s, i, 1:5] (match_len, length, position, counted)
      watch_ids  int32[S, W, K]        their tokens
    rows  (Batch.begin: per row r of a step)
      slot         int64[R]            its slot
      num_tokens   int64[R]            its tokens
      num_sampled  int64[R]            of them, written this step
      verified     int64[R]            of our draft's tokens, checked this step
      theirs       int64[R]            of vLLM's own draft's tokens, checked this step
      room         int64[R]            the most tokens its chain may hold (room_and_growth writes it)
      token_ids    int32[R, L]         its tokens, token_ids[r, :num_tokens[r]]
    out  (Batch's buffers: advance's results, per row r)
      ids        int64[R, K]           the chain drafted, ids[r, :len[r]]
      origin     int8[R, K]            each of its tokens' source (lookahead.draft's PROMPT, OUTPUT, DOCUMENTS, MEMORY)
      len        int64[R]              its length
      match      int64[R]              its anchor's length
      chance     float64[R, K]         the chance each of its tokens is kept
      status     int64[R]              LEARNT, DISCARDED or NO_PLAN (learn_row)
      counts     int64[5]              the step's verified drafts (count_drafts)
      per_pos    int64[K]              drafts with more than p tokens accepted (count_drafts)
      count      int64[R, K + 1]       its anchor's occurrences, and those its tokens followed (count_continuations)
    options  (Batch: LookupDrafter's options the chains follow)
      min_ngram, max_ngram  int        the grams indexed
      draft_factor          float      a chain holds at most draft_factor times its anchor's length
      token_chances         bool       whether advance prices each chain token (out chance and count, the gate's
                                         last chance); a caller that sizes from keep_chance alone skips that
    work  (Batch, LookupDrafter: engine.chain's scratch)
      trie       trie.py's trie tuple  the candidates (and the eos ids and vocab_limit no path runs into)
      ends       int64[MAX_NGRAM + 1]  match_ends' scratch (index.kernels.MAX_NGRAM)
      scratch    int64[3]              add_suffix_candidates' and add_longest_match's results; then (nodes, the
                                         root included; longest match; longest substitution match)
    lookup  (engine.chain's options: a row's, or a LookupDrafter's draft)
      num_draft_tokens   int           the most tokens a candidate (and the chain) holds
      prompt_len         int           the index's first tokens that are the prompt (the first-occurrence rule's)
      walk, substitution_walk  int     occurrences walked (policy.CHAIN_WALK, TREE_WALK)
      first_reach        int           occurrences searched for a first occurrence (policy.FIRST_REACH)
      first_only         bool          a prompt-only match's first occurrence is the request's only candidate
      draft_factor       float         a chain holds at most draft_factor times its anchor's length
    stores  (engine.chain: what a draft copies from besides the request; index tuples, n = 0 where none)
      documents          index tuple   the request's documents store
      memory             index tuple   what earlier requests wrote
"""

from numba import njit

ARENA_TOKENS, ARENA_PREV, ARENA_TABLE, ARENA_AT = range(4)
DOCS_ARENA, DOCS_N = range(2)
SLOTS_COLS, SLOTS_KEEP, SLOTS_OVERALL, SLOTS_PLAN_IDS, SLOTS_WATCH, SLOTS_WATCH_IDS = range(6)
ROWS_SLOT, ROWS_NUM_TOKENS, ROWS_NUM_SAMPLED, ROWS_VERIFIED, ROWS_THEIRS, ROWS_ROOM, ROWS_TOKEN_IDS = range(7)
OUT_IDS, OUT_ORIGIN, OUT_LEN, OUT_MATCH, OUT_CHANCE, OUT_STATUS, OUT_COUNTS, OUT_PER_POS, OUT_COUNT = range(9)
OPTIONS_MIN_NGRAM, OPTIONS_MAX_NGRAM, OPTIONS_DRAFT_FACTOR, OPTIONS_TOKEN_CHANCES = range(4)
WORK_TRIE, WORK_ENDS, WORK_SCRATCH = range(3)
(LOOKUP_NUM_DRAFT_TOKENS, LOOKUP_PROMPT_LEN, LOOKUP_WALK, LOOKUP_SUBSTITUTION_WALK, LOOKUP_FIRST_REACH, LOOKUP_FIRST_ONLY,
 LOOKUP_DRAFT_FACTOR) = range(7)
STORES_DOCUMENTS, STORES_MEMORY = range(2)


def arena_group(*, tokens, prev, table, at) -> tuple:
    return (tokens, prev, table, at)


def docs_group(*, arena, n) -> tuple:
    return (arena, n)


def slots_group(*, cols, keep, overall, plan_ids, watch, watch_ids) -> tuple:
    return (cols, keep, overall, plan_ids, watch, watch_ids)


def rows_group(*, slot, num_tokens, num_sampled, verified, theirs, room, token_ids) -> tuple:
    return (slot, num_tokens, num_sampled, verified, theirs, room, token_ids)


def out_group(*, ids, origin, len, match, chance, status, counts, per_pos, count) -> tuple:  # noqa: A002 (the field's name)
    return (ids, origin, len, match, chance, status, counts, per_pos, count)


def options_group(*, min_ngram, max_ngram, draft_factor, token_chances) -> tuple:
    return (min_ngram, max_ngram, draft_factor, token_chances)


def work_group(*, trie, ends, scratch) -> tuple:
    return (trie, ends, scratch)


@njit(cache=True, inline="always")
def lookup_group(num_draft_tokens, prompt_len, walk, substitution_walk, first_reach, first_only, draft_factor):
    return (num_draft_tokens, prompt_len, walk, substitution_walk, first_reach, first_only, draft_factor)


@njit(cache=True, inline="always")
def stores_group(documents, memory):
    return (documents, memory)
