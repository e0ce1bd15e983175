"""engine.arena.IndexArena: many token indexes in three arrays, against one TokenIndex per entry."""

import random

import numpy as np
import pytest

from lookahead.engine import kernels
from lookahead.engine.arena import TABLE_CAP, TOKEN_CAP, IndexArena
from lookahead.engine.groups import ROWS_SLOT
from lookahead.index import TokenIndex
from lookahead.index.kernels import index_ends, index_group, match_ends


@pytest.mark.parametrize("seed", range(4))
def test_entries_answer_as_their_own_indexes_through_growth_compaction_and_free(seed):
    """Random requests start, grow (their tokens and tables, as Slots.reserve grows them), are indexed and end;
    every live entry's longest match equals a TokenIndex's over the same tokens, and the arrays stay within
    twice the most the live regions and the one being taken ever held (at most 4x the live peak)."""
    rng = random.Random(seed)
    arena, live, used = IndexArena(8), {}, {}
    peak_tokens = peak_table = 0
    for _ in range(300):
        free = [e for e in range(arena.entries) if e not in live]
        if free and (not live or rng.random() < 0.3):
            e = rng.choice(free)
            arena.allocate(e, 4, 16)
            live[e], used[e] = [], 0
        elif live and rng.random() < 0.15:
            e = rng.choice(sorted(live))
            arena.free(e)
            del live[e], used[e]
        else:
            e = rng.choice(sorted(live))
            tokens = live[e]
            new = [rng.randrange(1, 6) for _ in range(rng.randrange(1, 12))]
            n = len(tokens) + len(new)
            token_cap, table_cap = (int(v) for v in arena.at[e, [TOKEN_CAP, TABLE_CAP]])
            while 8 * n > 0.82 * table_cap:  # room for every gram of 1..8 tokens
                table_cap = int(table_cap * 1.5)
            used[e] = arena.resize(e, max(token_cap, n), table_cap, copied=len(tokens), used=used[e])
            view_tokens, prev, table = kernels.view(arena.arrays(), e)
            view_tokens[len(tokens) : n] = new
            index = index_group.py_func(tokens=view_tokens, prev=prev, table=table, n=n, min_ngram=1, max_ngram=8)
            used[e] += index_ends(index, max(len(tokens) - 1, 0), n - 1)
            tokens.extend(new)
        peak_tokens, peak_table = max(peak_tokens, arena.live_tokens), max(peak_table, arena.live_table)
        assert arena.tokens.shape[0] <= 4 * peak_tokens and arena.table.shape[0] <= 4 * peak_table
        for e, tokens in live.items():
            if len(tokens) < 2:
                continue
            reference = TokenIndex(min_ngram=1, max_ngram=8)
            reference.extend(tokens)
            ends = np.zeros(17, dtype=np.int64)
            view_tokens, prev, table = kernels.view(arena.arrays(), e)
            index = index_group.py_func(tokens=view_tokens, prev=prev, table=table, n=len(tokens), min_ngram=1, max_ngram=8)
            query = np.asarray(tokens, dtype=np.int32)
            assert match_ends(index, query, len(tokens), ends) == reference.longest_match()[0]
            assert arena.tokens_of(e, len(tokens)).tolist() == tokens
    assert arena.compactions > 0  # freed regions were reclaimed, not only grown past


def test_an_entry_in_use_is_not_allocated_twice():
    arena = IndexArena(1)
    arena.allocate(0, 4, 8)
    with pytest.raises(ValueError, match="entry 0 is in use"):
        arena.allocate(0, 4, 8)


def test_a_kernel_refuses_to_write_past_a_slots_region():
    """The kernels write a row's tokens into its slot's region only after Batch.begin grew it; a caller that skipped
    begin gets an IndexError, not a write into the next region."""
    from lookahead import DocumentLibrary
    from lookahead.engine.batch import Batch

    batch = Batch(rows=1, num_draft_tokens=4, max_model_len=64, min_ngram=1, max_ngram=4, draft_factor=16.0, memory=None,
                  documents=DocumentLibrary(), min_tokens=4, min_table=16, thread=False)
    slot = batch.start("a", np.array([1, 2, 3]), 1, 3)
    tokens = np.arange(1, 11, dtype=np.int32)[None]  # 10 tokens: more than the slot's 4
    one = np.ones(1, dtype=np.int64)
    assert batch.begin(np.array([slot]), 10 * one, one, 0 * one, 0 * one, tokens) == 1  # grown: fine
    batch.advance(bar=-1.0, force=True)
    batch.slots.free(slot)
    slot = batch.start("b", np.array([1, 2, 3]), 1, 3)  # a fresh slot of 4 tokens, and the step's rows as begin left them
    rows = list(batch._step_rows)
    rows[ROWS_SLOT] = np.array([slot])
    batch._step_rows = tuple(rows)
    with pytest.raises(IndexError, match="Slots.reserve"):
        batch.advance(bar=-1.0, force=True)
