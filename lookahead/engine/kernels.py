"""The batched drafting engine's per-step kernels: arrays in a few named groups, one slot per live request.

A request holds a slot `s` for its life (rows move, slots do not). `engine.slots.Slots` owns and
grows every array; the kernels only read and write them, never resize. The kernels take them in the
groups engine.groups lays out (arena, docs, slots, rows, out, options, work), each field read by its
constant there (`rows[ROWS_NUM_TOKENS]`); the slots' token indexes are an arena's entries, entry s = slot s.

`advance` runs, for each row of a step, what `lookahead.request.Request` does for one request
(the keep rate learns from the tokens the step wrote, the index takes the new tokens, the chain is
drafted by the kernel `LookupDrafter.propose` calls, engine.chain.draft_chain);
sizing.rules.batch_sizes then cuts the chains to the load rule and `commit` records the plans.
tests/engine/test_batch.py checks both against the Python classes they follow.
"""

import math

from numba import njit

from lookahead.policy import CHAIN_WALK, FIRST_REACH
from lookahead.engine.arena import TABLE_AT, TABLE_CAP, TOKEN_AT, TOKEN_CAP
from lookahead.engine.chain import draft_chain
from lookahead.engine.groups import (ARENA_AT, ARENA_PREV, ARENA_TABLE, ARENA_TOKENS, DOCS_ARENA, DOCS_N,
                                     OPTIONS_DRAFT_FACTOR, OPTIONS_MAX_NGRAM, OPTIONS_MIN_NGRAM, OPTIONS_TOKEN_CHANCES,
                                     OUT_CHANCE, OUT_COUNT, OUT_COUNTS, OUT_IDS, OUT_LEN, OUT_MATCH, OUT_ORIGIN, OUT_PER_POS,
                                     OUT_STATUS, ROWS_NUM_SAMPLED, ROWS_NUM_TOKENS, ROWS_ROOM, ROWS_SLOT, ROWS_THEIRS,
                                     ROWS_TOKEN_IDS, ROWS_VERIFIED, SLOTS_COLS, SLOTS_KEEP, SLOTS_OVERALL,
                                     SLOTS_PLAN_IDS, SLOTS_WATCH, SLOTS_WATCH_IDS, WORK_ENDS, lookup_group,
                                     stores_group)
from lookahead.index.kernels import (INDEX_N, INDEX_TOKENS, count_continuations, grown_table, grown_tokens, index_ends,
                                     index_group)
from lookahead.sizing.rules import MAX_CHANCE

# columns of slots' cols
COPIED = 0  # tokens copied from the row: the slot's tokens[:COPIED]
INDEXED = 1  # of those, indexed (lazily: when the row drafts, or between steps: index_rows)
USED = 2  # table slots used
PROMPT_LEN = 3  # the source of the first-occurrence rule (trie.add_suffix_candidates)
DOC = 4  # the request's documents store (an entry of docs); -1: none
FIRST_TOKEN = 5  # the first and last copied tokens, for the reused-id check (stale_rows); -1: none
LAST_TOKEN = 6
PLAN_LEN = 7  # the pending chain's length (-1: no plan pending)
PLAN_SIZE = 8  # tokens of it sent
PLAN_MATCH = 9  # its anchor's length
PLAN_POS = 10  # the row's length when it was drafted
LAST_CHANCE = 11  # its last chain's first token's keep chance, in parts of CHANCE_SCALE (the gate in advance)
NUM_COLS = 12
CHANCE_SCALE = 1 << 20
GATE = 2  # a row whose last chain's first token's chance was below 1 / GATE of the bar is not drafted (a chance moves
          # from step to step: at one row the bar, about 0.1, gated a third of the steps that would have paid)

# The keep rate (learn_row, keep_chance): per anchor length, faded counts of kept tokens and failures; a length seen
# rarely leans on the rate over all lengths (PRIOR_WEIGHT pseudo-counts of it), so a request's first steps, each
# anchored on a longer match than the last, learn from one another.
PRIOR_WEIGHT = 2.0
FADE = 0.9  # old counts' weight at each update (up to K + 1 counts: a step's kept tokens and failure): 10 updates' memory
MAX_WATCHED = 8  # rests watched per request; the oldest is dropped past this

# Each chain token's keep chance (token_chances): how often the anchor's earlier occurrences went on with the
# chain's tokens (count_continuations over the request, its documents and memory: SuffixDecoding's frequency),
# shrunk toward the request's keep rate by FREQ_PRIOR pseudo-occurrences, and how many occurrences and how long an
# anchor back it, read through one logistic line. LINE was fitted to the kept tokens of Llama-3.1-8B-Instruct's
# recorded outputs (benchmarks/token_chances.py prints the fit and the chances' calibration).
REACH = 64  # occurrences of an anchor examined per store: O(REACH * (anchor + K)) a row
FREQ_PRIOR = 2.0
LINE = (-2.06, -0.47, 0.78, 0.35, 1.01)  # bias; weights of log(1 + depth), logit(frequency), log(1 + occurrences), log(1 + anchor)

# advance's per-row status (out_status)
NO_PLAN, LEARNT, DISCARDED = 0, 1, 2


@njit(cache=True, inline="always")
def view(arena, e):
    """(tokens, prev, table): entry e's index in an arena group (slices: bounds are the arena's)."""
    tokens, prev, table, at = arena[ARENA_TOKENS], arena[ARENA_PREV], arena[ARENA_TABLE], arena[ARENA_AT]
    t, c, b = at[e, TOKEN_AT], at[e, TOKEN_CAP], at[e, TABLE_AT]
    return tokens[t : t + c], prev[t : t + c], table[b : b + at[e, TABLE_CAP]]


@njit(cache=True, inline="always")
def entry_index(arena, e, n, min_ngram, max_ngram):
    # entry e's index tuple (index/kernels.py's) over its first n tokens
    tokens, prev, table = view(arena, e)
    return index_group(tokens=tokens, prev=prev, table=table, n=n, min_ngram=min_ngram, max_ngram=max_ngram)


@njit(cache=True, inline="always")
def _count(keep, overall, s, m, kept, failed):
    # old counts fade only when something is learnt
    if kept == 0 and not failed:
        return
    keep[s, m, 0] = FADE * keep[s, m, 0] + kept
    keep[s, m, 1] = FADE * keep[s, m, 1] + failed
    overall[s, 0] = FADE * overall[s, 0] + kept
    overall[s, 1] = FADE * overall[s, 1] + failed


@njit(cache=True, inline="always")
def keep_chance(keep, overall, s, match_len):
    """The chance that a token of slot s's chain anchored on match_len tokens is kept (0.5 before anything is learnt)."""
    m = min(match_len, keep.shape[1] - 1)
    prior = overall[s, 0] / (overall[s, 0] + overall[s, 1])
    return (keep[s, m, 0] + PRIOR_WEIGHT * prior) / (keep[s, m, 0] + keep[s, m, 1] + PRIOR_WEIGHT)


@njit(cache=True)
def _settle(keep, overall, watch, watch_ids, s, row, n):
    # watched rests against the row's tokens row[:n]; watch[s, i] = (count, match_len, length, position, counted)
    kept_entries = 0
    for i in range(watch[s, 0, 0]):
        m, length, position, counted = watch[s, i, 1], watch[s, i, 2], watch[s, i, 3], watch[s, i, 4]
        agree = counted
        while agree < length and position + agree < n and row[position + agree] == watch_ids[s, i, agree]:
            agree += 1
        failed = agree < length and position + agree < n
        _count(keep, overall, s, min(m, keep.shape[1] - 1), agree - counted, failed)
        if not failed and agree < length:  # still watched: compacted in arrival order
            if kept_entries != i:
                watch[s, kept_entries, 1:4] = watch[s, i, 1:4]
                watch_ids[s, kept_entries, :] = watch_ids[s, i, :]
            watch[s, kept_entries, 4] = agree
            kept_entries += 1
    watch[s, 0, 0] = kept_entries


@njit(cache=True)
def _watch(watch, watch_ids, s, m, ids, start, stop, position):
    # learn_row's watched rest ids[start:stop] from `position`; the oldest is dropped when full
    count = watch[s, 0, 0]
    if count == watch.shape[1]:
        for i in range(1, count):
            watch[s, i - 1, 1:5] = watch[s, i, 1:5]
            watch_ids[s, i - 1, :] = watch_ids[s, i, :]
        count -= 1
    watch[s, count, 1], watch[s, count, 2], watch[s, count, 3], watch[s, count, 4] = m, stop - start, position, 0
    for j in range(start, stop):
        watch_ids[s, count, j - start] = ids[j]
    watch[s, 0, 0] = count + 1


@njit(cache=True, inline="always")
def index_to(tok, prv, tab, cols, s, n, min_ngram, max_ngram):
    # slot s's index (tok, prv, tab) takes its tokens through tok[:n] not yet indexed (the grams ending at
    # positions before n - 1: the last token waits for the next, as its suffix is what a draft looks up)
    start = cols[s, INDEXED]
    if n > tok.shape[0]:  # (as in _learn: the slot was grown for its tokens first)
        raise IndexError("a slot is indexed past its tokens' region")
    if n > start:
        lo = max(start - 1, 0)
        if n - 1 > lo:
            index = index_group(tokens=tok, prev=prv, table=tab, n=n, min_ngram=min_ngram, max_ngram=max_ngram)
            cols[s, USED] += index_ends(index, lo, n - 1)
        cols[s, INDEXED] = n


@njit(cache=True, inline="always")
def row_indexes(arena, docs, cols, s, n, min_ngram, max_ngram):
    """(index, documents): slot s's index tuple over its n tokens, indexed up to them first (index_to), and its
    documents store's (none, d = -1: the slot's entry read as empty, n = 0); what a row drafts from besides memory."""
    tok, prv, tab = view(arena, s)
    index_to(tok, prv, tab, cols, s, n, min_ngram, max_ngram)
    index = index_group(tokens=tok, prev=prv, table=tab, n=n, min_ngram=min_ngram, max_ngram=max_ngram)
    d = cols[s, DOC]
    doc_arena, doc_n = docs[DOCS_ARENA], docs[DOCS_N]
    documents = (entry_index(doc_arena, d, doc_n[d], min_ngram, max_ngram) if d >= 0
                 else entry_index(arena, s, 0, min_ngram, max_ngram))
    return index, documents


@njit(cache=True, inline="always")
def learn_row(slots, s, row, n, c, verified):
    """What slot s learns once a step wrote its last c tokens, row[n - c:n] (row[:n]: the request's tokens),
    verified[r] of its pending plan's tokens checked: the plan is resolved (Request.verified) and watched rests
    settle against the row. Returns LEARNT (the plan taught the keep rate: the request moved by the step's
    tokens and its draft was checked, or nothing of it was sent), DISCARDED (sent, not verified: dropped
    unlearnt) or NO_PLAN.

    The keep rate, per anchor length m of the plan: its first `agree` tokens equal to what the model wrote
    count as kept, a disagreement among the checked tokens as one failure (counts fade by FADE when either
    grows); a chain all of whose checked tokens agree has its unchecked rest watched (MAX_WATCHED, oldest
    dropped), each rest token counted as the model later writes it, a disagreement as its failure."""
    cols, keep, overall, plan_ids = slots[SLOTS_COLS], slots[SLOTS_KEEP], slots[SLOTS_OVERALL], slots[SLOTS_PLAN_IDS]
    watch, watch_ids = slots[SLOTS_WATCH], slots[SLOTS_WATCH_IDS]
    status = NO_PLAN
    if cols[s, PLAN_LEN] >= 0:
        moved = c > 0 and n == cols[s, PLAN_POS] + c
        if moved and not (cols[s, PLAN_SIZE] > 0 and verified == 0):
            length = cols[s, PLAN_LEN]
            checked = min(verified, c, length)
            agree = 0
            while agree < checked and plan_ids[s, agree] == row[n - c + agree]:
                agree += 1
            m = min(cols[s, PLAN_MATCH], keep.shape[1] - 1)
            _count(keep, overall, s, m, agree, agree < checked)
            if agree == checked and agree < length:
                _watch(watch, watch_ids, s, cols[s, PLAN_MATCH], plan_ids[s], agree, length, cols[s, PLAN_POS] + agree)
            status = LEARNT
        elif cols[s, PLAN_SIZE] > 0:
            status = DISCARDED
        cols[s, PLAN_LEN] = -1
    if watch[s, 0, 0]:
        _settle(keep, overall, watch, watch_ids, s, row, n)
    return status


@njit(cache=True)
def keep_chances(slots, rows_slot, match, out):
    """out[r]: keep_chance of row r's slot at an anchor of match[r] tokens (a chain's chance per token, for every row)."""
    keep, overall = slots[SLOTS_KEEP], slots[SLOTS_OVERALL]
    for r in range(rows_slot.shape[0]):
        out[r] = keep_chance(keep, overall, rows_slot[r], match[r])


@njit(cache=True)
def settle_row(slots, s, row, n):
    """Slot s's watched rests settle against row[:n] (tokens that came outside a plan)."""
    watch = slots[SLOTS_WATCH]
    if watch[s, 0, 0]:
        _settle(slots[SLOTS_KEEP], slots[SLOTS_OVERALL], watch, slots[SLOTS_WATCH_IDS], s, row, n)


@njit(cache=True, inline="always")
def plan_row(slots, s, ids, length, size, match, position):
    """Slot s's pending plan (Request.commit): the chain ids[:length] (at most K tokens kept), `size` of its
    tokens sent, anchored on `match` tokens, drafted when the request had `position` tokens."""
    cols, plan_ids = slots[SLOTS_COLS], slots[SLOTS_PLAN_IDS]
    length = min(length, plan_ids.shape[1])
    cols[s, PLAN_LEN], cols[s, PLAN_SIZE], cols[s, PLAN_MATCH], cols[s, PLAN_POS] = length, size, match, position
    for j in range(length):
        plan_ids[s, j] = ids[j]


@njit(cache=True)
def tree_kept(parents, token_ids, kept, out):
    """out[i]: node i's depth where it lies on the path of the `kept` tokens (what a step kept of a tree whose
    parents[i] < i, -1 the root: its root path equals kept[:depth]), else 0. O(nodes)."""
    for i in range(parents.shape[0]):
        p = parents[i]
        d = 1 if p < 0 else out[p] + 1 if out[p] > 0 else 0
        out[i] = d if 0 < d <= kept.shape[0] and token_ids[i] == kept[d - 1] else 0


@njit(cache=True)
def _learn(rows, slots, arena, out):
    # advance's first pass: each row's pending plan resolved, its watched rests settled, its new tokens copied
    rows_slot, num_tokens, num_sampled = rows[ROWS_SLOT], rows[ROWS_NUM_TOKENS], rows[ROWS_NUM_SAMPLED]
    verified, token_ids = rows[ROWS_VERIFIED], rows[ROWS_TOKEN_IDS]
    cols = slots[SLOTS_COLS]
    out_status = out[OUT_STATUS]
    for r in range(rows_slot.shape[0]):
        s = rows_slot[r]
        n = num_tokens[r]
        row = token_ids[r]
        out_status[r] = learn_row(slots, s, row, n, num_sampled[r], verified[r])
        if n > cols[s, COPIED]:
            tok = view(arena, s)[0]
            if n > tok.shape[0]:  # (room_and_growth grows every slot first: never, unless a caller skipped it)
                raise IndexError("a row has more tokens than its slot holds: Slots.reserve was not called")
            for pos in range(cols[s, COPIED], n):
                tok[pos] = row[pos]
            cols[s, COPIED] = n
            cols[s, LAST_TOKEN] = row[n - 1]


@njit(cache=True)
def token_chances(counts, length, chance, anchored, out):
    """out[j] (j < length): the chance that token j of a chain anchored on `anchored` tokens is kept, not rising
    with j. counts: count_continuations' (occurrences of the anchor, and those followed by the chain's first j + 1
    tokens); chance: the request's keep rate per token (keep_chance), the prior of the frequency."""
    bias, w_depth, w_freq, w_count, w_match = LINE
    base = bias + w_count * math.log(1.0 + counts[0]) + w_match * math.log(1.0 + max(anchored, 1))
    last = 1.0
    prior = 1.0
    for j in range(length):
        prior *= chance
        freq = (counts[1 + j] + FREQ_PRIOR * prior) / (counts[0] + FREQ_PRIOR)
        freq = min(max(freq, 1e-3), 1.0 - 1e-3)
        z = base + w_depth * math.log(1.0 + j) + w_freq * math.log(freq / (1.0 - freq))
        last = min(last, 1.0 / (1.0 + math.exp(-z)))
        out[j] = last


@njit(cache=True)
def advance(rows, slots, arena, docs, memory, options, bar, force, work, out):
    """One step over every row: learn from the tokens it wrote, count the drafts verified, index them, draft its chain.

    Per row r (slot s = rows_slot[r], the row's tokens token_ids[r, :num_tokens[r]], its last
    num_sampled[r] written this step, of which verified[r] were our draft's tokens vLLM checked):
    - the pending plan is resolved as Request.verified does: learnt from when the row moved by
      the step's tokens and vLLM checked it (or we had sent nothing), dropped otherwise
      (out_status: LEARNT, DISCARDED, NO_PLAN); watched rests settle against the row;
    - the slot takes the row's new tokens.
    The step's verified drafts are counted into counts and per_pos (count_drafts; theirs[r]: tokens
    of vLLM's own draft the row verified).
    Then each row with room[r] > 0 whose last chain's first token had a chance above `bar` / GATE
    (the load rule's first bar: below it the rule takes no token of the row; a new request's
    first step always drafts), or every such row with `force`, has its index take the tokens not
    yet indexed and drafts its chain of at most room[r] tokens with engine.chain.draft_chain, the
    kernel LookupDrafter.propose calls (the slot's index and prompt, its documents store, memory;
    policy.CHAIN_WALK and FIRST_REACH): out_ids[r, :out_len[r]], their sources out_origin[r],
    anchored on out_match[r] tokens, its token j kept with chance out_chance[r, j] (token_chances;
    the anchor's occurrences and those its tokens followed, in the request, its documents and
    memory, in out_count[r]; only with options' token_chances, which the gate needs). Returns (whether any row drafted, whether any count is not 0, tokens
    of rows with room left unindexed: index_rows').
    memory: the shared store's index tuple (index/kernels.py; holding no token where there is
    none); arena: the slots' indexes (entry s = slot s); the other groups are engine.groups'. The caller has grown every extended slot's regions
    for its new tokens (room_and_growth, Slots.reserve).
    """
    min_ngram, max_ngram = options[OPTIONS_MIN_NGRAM], options[OPTIONS_MAX_NGRAM]
    draft_factor, priced = options[OPTIONS_DRAFT_FACTOR], options[OPTIONS_TOKEN_CHANCES]
    rows_slot, num_tokens, room = rows[ROWS_SLOT], rows[ROWS_NUM_TOKENS], rows[ROWS_ROOM]
    cols, keep, overall = slots[SLOTS_COLS], slots[SLOTS_KEEP], slots[SLOTS_OVERALL]
    ends = work[WORK_ENDS]
    out_ids, out_origin, out_len, out_match, out_chance = out[OUT_IDS], out[OUT_ORIGIN], out[OUT_LEN], out[OUT_MATCH], out[OUT_CHANCE]
    out_count = out[OUT_COUNT]
    num_rows = rows_slot.shape[0]
    out_len[:num_rows] = 0
    out_match[:num_rows] = 0
    _learn(rows, slots, arena, out)
    counted = count_drafts(out[OUT_STATUS][:num_rows], rows[ROWS_VERIFIED], rows[ROWS_THEIRS], rows[ROWS_NUM_SAMPLED],
                           out[OUT_COUNTS], out[OUT_PER_POS])
    drafted = False
    if not force and bar >= MAX_CHANCE:  # no row's chance (capped at MAX_CHANCE) can beat the bar: none drafts
        return drafted, counted, _pending(rows_slot, num_tokens, room, cols)
    for r in range(num_rows):
        s = rows_slot[r]
        n = num_tokens[r]
        limit = room[r]
        if limit <= 0 or n < 1:
            continue
        if not force and GATE * cols[s, LAST_CHANCE] <= bar * CHANCE_SCALE:  # its last chain was far below the bar: not drafted
            continue
        drafted = True
        index, documents = row_indexes(arena, docs, cols, s, n, min_ngram, max_ngram)
        tok = index[INDEX_TOKENS]
        lookup = lookup_group(num_draft_tokens=limit, prompt_len=cols[s, PROMPT_LEN], walk=CHAIN_WALK[0],
                              substitution_walk=CHAIN_WALK[1], first_reach=FIRST_REACH, first_only=True, draft_factor=draft_factor)
        length, anchored = draft_chain(index, stores_group(documents=documents, memory=memory), lookup, work, out_ids[r],
                                       out_origin[r])
        out_len[r] = length
        out_match[r] = anchored
        if length and priced:
            found = out_count[r]
            found[:] = 0
            m = min(max(anchored, 1), max_ngram)
            path = out_ids[r]
            count_continuations(index, tok[:n], m, path, length, REACH, ends, found)
            query = tok[max(0, n - max_ngram) : n]  # what the stores were asked for
            if documents[INDEX_N] > 0:
                count_continuations(documents, query, m, path, length, REACH, ends, found)
            if memory[INDEX_N] > 0:
                count_continuations(memory, query, m, path, length, REACH, ends, found)
            token_chances(found, length, keep_chance(keep, overall, s, anchored), anchored, out_chance[r])
            cols[s, LAST_CHANCE] = int(out_chance[r, 0] * CHANCE_SCALE)
    return drafted, counted, _pending(rows_slot, num_tokens, room, cols)


@njit(cache=True, inline="always")
def _pending(rows_slot, num_tokens, room, cols):
    # tokens of the rows with room that their slots have not indexed (index_rows' work)
    pending = 0
    for r in range(rows_slot.shape[0]):
        if room[r] > 0:
            pending += num_tokens[r] - cols[rows_slot[r], INDEXED]
    return pending


@njit(cache=True, nogil=True)
def index_rows(rows_slot, room, cols, arena, min_ngram, max_ngram):
    """Indexes, for each row with room[r] > 0, its slot's copied tokens not yet indexed: what advance
    indexes when the row next drafts, done ahead, between steps (nogil: on a thread beside the engine's
    Python; the caller holds every array it passes until it returns). room_and_growth sized those rows'
    tables for them. The index is the same whenever its tokens are taken (index_ends is incremental)."""
    for r in range(rows_slot.shape[0]):
        if room[r] > 0:
            s = rows_slot[r]
            tok, prv, tab = view(arena, s)
            index_to(tok, prv, tab, cols, s, cols[s, COPIED], min_ngram, max_ngram)


@njit(cache=True)
def stale_rows(rows_slot, num_tokens, token_ids, cols, stale):
    """stale[r]: whether row r's slot (>= 0) holds another request's tokens (more tokens than the
    row, or another first or last copied token: vLLM reused the request id); returns how many."""
    count = 0
    for r in range(rows_slot.shape[0]):
        s = rows_slot[r]
        stale[r] = False
        if s < 0 or cols[s, COPIED] == 0:
            continue
        c = cols[s, COPIED]
        if c > num_tokens[r] or token_ids[r, c - 1] != cols[s, LAST_TOKEN] or token_ids[r, 0] != cols[s, FIRST_TOKEN]:
            stale[r] = True
            count += 1
    return count


@njit(cache=True)
def room_and_growth(rows, cols, at, k, max_model_len, grams, new_tokens, new_table):
    """Writes room[r] (in rows): the most tokens row r's chain may hold (0: a prefill chunk or a step vLLM
    discarded); new_tokens[r], new_table[r]: the capacities row r's slot must grow to before `advance`
    writes it (0: big enough), which Slots.reserve allocates. Returns (decode rows, rows whose slot must grow).

    k: the longest chain; grams: the gram lengths indexed (max_ngram - min_ngram + 1). The growth rule is
    TokenIndex's (index.kernels.grown_tokens, grown_table): the tokens grow for n + 1 once n outgrows them; a
    drafting row's table for used + (tokens not yet indexed) * grams slots, what indexing them adds at most.
    """
    rows_slot, num_tokens, num_sampled, room = rows[ROWS_SLOT], rows[ROWS_NUM_TOKENS], rows[ROWS_NUM_SAMPLED], rows[ROWS_ROOM]
    decode = 0
    grows = 0
    for r in range(rows_slot.shape[0]):
        s = rows_slot[r]
        n = num_tokens[r]
        room[r] = min(k, max_model_len - n) if num_sampled[r] > 0 else 0
        new_tokens[r] = 0
        new_table[r] = 0
        if n > at[s, TOKEN_CAP]:
            new_tokens[r] = grown_tokens(at[s, TOKEN_CAP], n + 1)
        if room[r] > 0:
            decode += 1
            table = grown_table(at[s, TABLE_CAP], cols[s, USED] + max(n - cols[s, INDEXED], 0) * grams)
            if table > at[s, TABLE_CAP]:
                new_table[r] = table
        if new_tokens[r] or new_table[r]:
            grows += 1
    return decode, grows


@njit(cache=True)
def count_drafts(status, verified, theirs, num_sampled, counts, per_pos):
    """Counts the drafts a step verified as vLLM's metrics do: ours where learnt from (status LEARNT,
    verified[r] > 0), vLLM's own (theirs[r] > 0); num_sampled[r] - 1 of each accepted.
    counts = (drafts, draft tokens, accepted tokens, vLLM's drafts, discarded drafts);
    per_pos[p] = drafts with more than p tokens accepted. Returns whether any count is not 0."""
    counts[:] = 0
    per_pos[:] = 0
    for r in range(status.shape[0]):
        if status[r] == DISCARDED:
            counts[4] += 1
        drafted = verified[r] if status[r] == LEARNT and verified[r] > 0 else theirs[r]
        if drafted <= 0:
            continue
        counts[3] += theirs[r] > 0
        accepted = num_sampled[r] - 1
        counts[0] += 1
        counts[1] += drafted
        counts[2] += accepted
        for p in range(min(accepted, per_pos.shape[0])):
            per_pos[p] += 1
    return counts[0] > 0 or counts[4] > 0


@njit(cache=True)
def commit(rows_slot, num_tokens, sizes, out, slots):
    """Records each drafted row's plan (Request.commit): its chain (out's), the `sizes[r]` tokens of it sent.
    Returns (tokens drafted, tokens sent) over the rows."""
    out_ids, out_len, out_match = out[OUT_IDS], out[OUT_LEN], out[OUT_MATCH]
    drafted = 0
    sent = 0
    for r in range(rows_slot.shape[0]):
        length = out_len[r]
        if length == 0:
            continue
        drafted += length
        sent += sizes[r]
        plan_row(slots, rows_slot[r], out_ids[r], length, sizes[r], out_match[r], num_tokens[r])
    return drafted, sent
