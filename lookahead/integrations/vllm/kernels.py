"""The proposer's per-step work over all rows: two numba kernels over buffers kept per request slot.

A request holds a slot `s` for its life in the proposer (rows move, slots do not). Per slot
(allocated by `SlotBuffers` in the proposer, grown outside the kernels):

    address     int64[S, 3]          # where slot s's tokens, prev and table lie (int32 arrays SlotBuffers holds)
    token_capacity, table_capacity   # int64[S]: their lengths; _arrays_at views them as tokens[s], prev[s], table[s]
    tokens[s]   int32[cap]           # the request's tokens as indexed (a TokenIndex's buffers, kernels.py's layout)
    prev[s]     int32[cap]
    table[s]    int32[cap_slots]
    copied      int64[S]             # tokens copied from the row: tokens[s][:copied[s]]
    indexed     int64[S]             # of those, indexed (lazily: when the row drafts, or between steps: index_rows)
    used        int64[S]             # table slots used
    prompt_len  int64[S]             # the source of the first-occurrence rule (LookupDrafter._fill_trie)
    doc         int64[S]             # index into `docs` of the request's documents store; -1: none
    keep        float64[S, M + 1, 2] # per anchor length m: faded (kept tokens, failures), as sizing.KeepRate
    overall     float64[S, 2]        # faded (kept, failed) over every length, prior (1, 1)
    plan_len    int64[S]             # the pending chain's length (-1: no plan pending)
    plan_size, plan_match, plan_pos  # tokens of it sent; its anchor length; the row's length when drafted
    plan_ids    int32[S, K]          # the pending chain
    watch_*     [S, W(, K)]          # rests of chains past what was verified, in order of arrival (KeepRate.watched)

`advance` runs, for each row of a step, what `lookahead.request.Request` does for one request
(the keep rate learns from the tokens the step wrote, the index takes the new tokens, the
chain is drafted as `LookupDrafter.propose` drafts it, through the same index and trie
kernels); sizing.rules.batch_sizes (batch_draft_sizes' kernel) then cuts the chains to the load
rule and `commit` records the plans. tests/test_vllm.py checks both against the Python classes they follow.

The arrays are passed by address, not as numba typed Lists: unboxing a List argument runs Python
(its type's property, an unpickle), about 40 µs of every cold step (docs/vllm.md).
"""

import math

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from lookahead.drafter import MATCH_BASE, SKIP_SCALE, STORE_SCALE, SUBSTITUTION_SCALE
from lookahead.index import SEPARATOR
from lookahead.index.kernels import EMPTY, index_ends
from lookahead.sizing.keep_rate import KeepRate
from lookahead.sizing.rules import MAX_CHANCE
from lookahead.trie import add_longest_match, add_suffix_candidates, heaviest_path, path_shares

CHAIN_WALK = (8, 4)  # LookupDrafter.chain_walk: occurrences walked (of the suffix, of the suffix less its last token)
FIRST_REACH = 64  # LookupDrafter.first_reach
PRIOR_WEIGHT = KeepRate.PRIOR_WEIGHT
FADE = 0.9  # KeepRate's default fade
MAX_WATCHED = 8  # rests watched per request; the oldest is dropped past this (KeepRate keeps every one)

# advance's per-row status (out_status)
NO_PLAN, LEARNT, DISCARDED = 0, 1, 2


@intrinsic
def _int32s_at(typingctx, address):
    # an address (int64) as an int32 pointer, for carray
    pointer = types.CPointer(types.int32)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer))

    return pointer(types.int64), codegen


def addresses(tokens, prev, table) -> list[int]:
    """Where an index's three arrays lie (a row of `address`, or of the proposer's documents'), for _arrays_at:
    int32 and contiguous, as the kernels read them. The caller keeps the arrays alive while the row names them."""
    for array in (tokens, prev, table):
        if array.dtype != np.int32 or not array.flags.c_contiguous:
            raise TypeError(f"an index array must be contiguous int32, got {array.dtype} (contiguous: {array.flags.c_contiguous})")
    return [tokens.ctypes.data, prev.ctypes.data, table.ctypes.data]


@njit(cache=True, inline="always")
def _arrays_at(address, i, token_len, table_len):
    """(tokens, prev, table): views of the arrays at address[i] (see `addresses`)."""
    tokens = carray(_int32s_at(address[i, 0]), token_len)
    prev = carray(_int32s_at(address[i, 1]), token_len)
    return tokens, prev, carray(_int32s_at(address[i, 2]), table_len)


@njit(cache=True, inline="always")
def _count(keep, overall, s, m, kept, failed):
    # KeepRate._count: old counts fade only when something is learnt
    if kept == 0 and not failed:
        return
    keep[s, m, 0] = FADE * keep[s, m, 0] + kept
    keep[s, m, 1] = FADE * keep[s, m, 1] + failed
    overall[s, 0] = FADE * overall[s, 0] + kept
    overall[s, 1] = FADE * overall[s, 1] + failed


@njit(cache=True, inline="always")
def keep_chance(keep, overall, s, match_len):
    """KeepRate.keep_chance of slot s for an anchor of match_len tokens."""
    m = min(match_len, keep.shape[1] - 1)
    prior = overall[s, 0] / (overall[s, 0] + overall[s, 1])
    return (keep[s, m, 0] + PRIOR_WEIGHT * prior) / (keep[s, m, 0] + keep[s, m, 1] + PRIOR_WEIGHT)


@njit(cache=True)
def _settle(keep, overall, watch, watch_ids, s, row, n):
    # KeepRate.settle against the row's tokens row[:n]; watch[s, i] = (count, match_len, length, position, counted)
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
    # KeepRate.observe's watched rest ids[start:stop] from `position`; the oldest is dropped when full
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
def _index_to(tok, prv, tab, indexed, used, s, n, min_ngram, max_ngram):
    # slot s's index (tok, prv, tab) takes its tokens through tok[:n] not yet indexed (the grams ending at
    # positions before n - 1: the last token's wait for the next, as its suffix is what a draft looks up)
    start = indexed[s]
    if n > start:
        lo = max(start - 1, 0)
        if n - 1 > lo:
            used[s] += index_ends((tok, prv, tab, n, min_ngram, max_ngram), lo, n - 1)
        indexed[s] = n


@njit(cache=True)
def advance(rows_slot, num_tokens, num_sampled, verified, theirs, room, bar, force, token_ids,  # per row, and the load's bar
            address, token_capacity, table_capacity, copied, indexed, used, prompt_len, doc, last_token,  # per slot: the index
            keep, overall, plan_len, plan_size, plan_match, plan_pos, plan_ids, watch, watch_ids,  # per slot: learning
            doc_address, doc_shape, memory, options, trie, ends, scratch,  # shared
            out_ids, out_len, out_match, out_chance, out_share, out_status, counts, per_pos):  # results
    """One step over every row: learn from the tokens it wrote, count the drafts verified, index them, draft its chain.

    Per row r (slot s = rows_slot[r], the row's tokens token_ids[r, :num_tokens[r]], its last
    num_sampled[r] written this step, of which verified[r] were our draft's tokens vLLM checked):
    - the pending plan is resolved as Request.verified does: learnt from when the row moved by
      the step's tokens and vLLM checked it (or we had sent nothing), dropped otherwise
      (out_status: LEARNT, DISCARDED, NO_PLAN); watched rests settle against the row;
    - the slot takes the row's new tokens (tokens[s][copied:num_tokens]).
    The step's verified drafts are counted into counts and per_pos (count_drafts; theirs[r]: tokens
    of vLLM's own draft the row verified).
    Then each row with room[r] > 0 whose keep chance beats `bar` for some anchor length (the load
    rule's first bar: below it the rule takes no token of the row), or every such row with
    `force`, has its index take the tokens not yet indexed and drafts the chain of at most
    room[r] tokens LookupDrafter.propose drafts: out_ids[r, :out_len[r]], anchored on
    out_match[r] tokens, each kept with chance out_chance[r] (the keep rate) times out_share[r, j]
    (the branch shares its path kept in the trie: trie.path_shares). Returns (whether any row
    drafted, whether any count is not 0, tokens of rows with room left unindexed: index_rows').
    options = (min_ngram, max_ngram, draft_factor, has_memory). The caller has grown every
    extended slot's buffers for its new tokens (room_and_growth, SlotBuffers.reserve).
    """
    min_ngram, max_ngram, draft_factor, has_memory = options
    token, parent, weight, child, sibling, _, _ = trie
    for r in range(rows_slot.shape[0]):
        s = rows_slot[r]
        n = num_tokens[r]
        c = num_sampled[r]
        row = token_ids[r]
        out_len[r] = 0
        out_match[r] = 0
        out_chance[r] = 0.0
        out_status[r] = NO_PLAN
        if plan_len[s] >= 0:
            moved = c > 0 and n == plan_pos[s] + c
            if moved and not (plan_size[s] > 0 and verified[r] == 0):
                # KeepRate.observe(match, chain, checked=verified, written=row[n - c:n], position)
                length = plan_len[s]
                checked = min(verified[r], c, length)
                agree = 0
                while agree < checked and plan_ids[s, agree] == row[n - c + agree]:
                    agree += 1
                m = min(plan_match[s], keep.shape[1] - 1)
                _count(keep, overall, s, m, agree, agree < checked)
                if agree == checked and agree < length:
                    _watch(watch, watch_ids, s, plan_match[s], plan_ids[s], agree, length, plan_pos[s] + agree)
                out_status[r] = LEARNT
            elif plan_size[s] > 0:
                out_status[r] = DISCARDED
            plan_len[s] = -1
        if watch[s, 0, 0]:
            _settle(keep, overall, watch, watch_ids, s, row, n)
        if n > copied[s]:
            tok = _arrays_at(address, s, token_capacity[s], table_capacity[s])[0]
            for pos in range(copied[s], n):
                tok[pos] = row[pos]
            copied[s] = n
            last_token[s] = row[n - 1]
    counted = count_drafts(out_status[: rows_slot.shape[0]], verified, theirs, num_sampled, counts, per_pos)
    drafted = False
    if not force and bar >= MAX_CHANCE:  # no row's chance (capped at MAX_CHANCE) can beat the bar: none drafts
        return drafted, counted, _pending(rows_slot, num_tokens, room, indexed)
    for r in range(rows_slot.shape[0]):
        s = rows_slot[r]
        n = num_tokens[r]
        row = token_ids[r]
        limit = room[r]
        if limit <= 0 or n < 1:
            continue
        if not force:  # a row none of whose anchor lengths beats the bar gets no token from the rule: not drafted
            pays = False
            for m in range(keep.shape[1]):
                if min(keep_chance(keep, overall, s, m), MAX_CHANCE) > bar:
                    pays = True
                    break
            if not pays:
                continue
        drafted = True
        tok, prv, tab = _arrays_at(address, s, token_capacity[s], table_capacity[s])
        _index_to(tok, prv, tab, indexed, used, s, n, min_ngram, max_ngram)
        # LookupDrafter._fill_trie(limit, *chain_walk, first_only=True), then the heaviest path
        token[0], parent[0], weight[0], child[0], sibling[0] = -1, -1, 0.0, EMPTY, EMPTY
        index = (tok, prv, tab, n, min_ngram, max_ngram)
        add_suffix_candidates(index, (limit, MATCH_BASE, CHAIN_WALK[0], CHAIN_WALK[1], SUBSTITUTION_SCALE, SKIP_SCALE,
                                      prompt_len[s], FIRST_REACH, True), trie, 1, ends, scratch)
        count, match_len, substituted = scratch[0], scratch[1], scratch[2]
        if match_len < max_ngram - 1:  # else no store's match can outweigh it
            query = tok[max(0, n - max_ngram) : n]
            d = doc[s]
            if d >= 0 and doc_shape[d, 2] > 0:  # doc_shape[d] = (tokens' length, table's length, n, min_ngram, max_ngram)
                document = _arrays_at(doc_address, d, doc_shape[d, 0], doc_shape[d, 1]) + (doc_shape[d, 2], doc_shape[d, 3],
                                                                                           doc_shape[d, 4])
                add_longest_match(document, query, (limit, MATCH_BASE, STORE_SCALE, SEPARATOR), trie, count, ends, scratch)
                count, match_len = scratch[0], max(match_len, scratch[1])
            if has_memory and memory[3] > 0:
                add_longest_match(memory, query, (limit, MATCH_BASE, STORE_SCALE, SEPARATOR), trie, count, ends, scratch)
                count, match_len = scratch[0], max(match_len, scratch[1])
        anchored = max(match_len, substituted) if count > 1 else 0
        length = heaviest_path(trie, min(limit, math.ceil(draft_factor * anchored)), 0, out_ids[r])  # its nodes
        path_shares(trie, out_ids[r], length, out_share[r])
        for i in range(length):
            out_ids[r, i] = trie[0][out_ids[r, i]]  # the nodes' tokens
        out_len[r] = length
        out_match[r] = anchored
        if length:
            out_chance[r] = keep_chance(keep, overall, s, anchored)
    return drafted, counted, _pending(rows_slot, num_tokens, room, indexed)


@njit(cache=True, inline="always")
def _pending(rows_slot, num_tokens, room, indexed):
    # tokens of the rows with room that their slots have not indexed (index_rows' work)
    pending = 0
    for r in range(rows_slot.shape[0]):
        if room[r] > 0:
            pending += num_tokens[r] - indexed[rows_slot[r]]
    return pending


@njit(cache=True, nogil=True)
def index_rows(rows_slot, room, address, token_capacity, table_capacity, copied, indexed, used, min_ngram, max_ngram):
    """Indexes, for each row with room[r] > 0, its slot's copied tokens not yet indexed: what advance
    indexes when the row next drafts, done ahead, between steps (the proposer's BetweenSteps thread;
    nogil: it runs beside the engine's Python). room_and_growth sized those rows' tables for them.
    The index is the same whenever its tokens are taken (index_ends is incremental by position)."""
    for r in range(rows_slot.shape[0]):
        if room[r] > 0:
            s = rows_slot[r]
            tok, prv, tab = _arrays_at(address, s, token_capacity[s], table_capacity[s])
            _index_to(tok, prv, tab, indexed, used, s, copied[s], min_ngram, max_ngram)


@njit(cache=True)
def stale_rows(rows_slot, num_tokens, token_ids, copied, last_token, first_token, stale):
    """stale[r]: whether row r's slot (>= 0) holds another request's tokens (more tokens than the
    row, or another first or last copied token: vLLM reused the request id); returns how many."""
    count = 0
    for r in range(rows_slot.shape[0]):
        s = rows_slot[r]
        stale[r] = False
        if s < 0 or copied[s] == 0:
            continue
        c = copied[s]
        if c > num_tokens[r] or token_ids[r, c - 1] != last_token[s] or token_ids[r, 0] != first_token[s]:
            stale[r] = True
            count += 1
    return count


@njit(cache=True)
def room_and_growth(rows_slot, num_tokens, num_sampled, k, max_model_len, token_capacity, used, indexed,
                    table_capacity, grams, max_load, growth, room, new_tokens, new_table):
    """room[r]: the most tokens row r's chain may hold (0: a prefill chunk or a step vLLM
    discarded); new_tokens[r], new_table[r]: the capacities row r's slot must grow to before
    `advance` writes it (0: big enough), which SlotBuffers.reserve allocates. Returns (decode
    rows, rows whose slot must grow).

    The growth rule (TokenIndex's): the tokens grow by `growth` or to n + 1, whichever is more;
    a drafting row's table holds used + (tokens not yet indexed) * grams slots at most, kept at
    most `max_load` full by growing by `growth`.
    """
    decode = 0
    grows = 0
    for r in range(rows_slot.shape[0]):
        s = rows_slot[r]
        n = num_tokens[r]
        room[r] = min(k, max_model_len - n) if num_sampled[r] > 0 else 0
        new_tokens[r] = 0
        new_table[r] = 0
        if n > token_capacity[s]:
            new_tokens[r] = max(int(token_capacity[s] * growth), n + 1)
        if room[r] > 0:
            decode += 1
            need = used[s] + max(n - indexed[s], 0) * grams
            if need > max_load * table_capacity[s]:
                capacity = table_capacity[s]
                while need > max_load * capacity:
                    capacity = int(capacity * growth)
                new_table[r] = capacity
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
def commit(rows_slot, num_tokens, sizes, out_ids, out_len, out_match, plan_len, plan_size, plan_match, plan_pos, plan_ids):
    """Records each drafted row's plan (Request.commit): its chain, the `sizes[r]` tokens of it sent.
    Returns (tokens drafted, tokens sent) over the rows."""
    drafted = 0
    sent = 0
    for r in range(rows_slot.shape[0]):
        length = out_len[r]
        if length == 0:
            continue
        drafted += length
        sent += sizes[r]
        s = rows_slot[r]
        plan_len[s], plan_size[s], plan_match[s], plan_pos[s] = length, sizes[r], out_match[r], num_tokens[r]
        for j in range(length):
            plan_ids[s, j] = out_ids[r, j]
    return drafted, sent
