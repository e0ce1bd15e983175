"""The index's growth rule (index.kernels.grown_tokens, grown_table), written once and taken by every token index."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from lookahead import TokenIndex
from lookahead.engine import kernels as engine_kernels
from lookahead.engine.arena import TABLE_CAP, TOKEN_CAP
from lookahead.engine.groups import rows_group
from lookahead.engine.slots import HEADROOM, Slots
from lookahead.index import kernels
from lookahead.index.kernels import GROWTH, MAX_LOAD, grown_table, grown_tokens


def test_warm_up_compiles_the_growth_rule():
    kernels.warm_up()
    for kernel in (grown_tokens, grown_table):
        assert kernel.signatures, f"{kernel.__name__} was not compiled"


def test_a_table_of_one_slot_grows():  # int(1 * GROWTH) == 1: GROWTH alone would never get there
    assert grown_table(1, 1) == 2 and grown_table(0, 1) == 2


@given(st.integers(1, 1 << 20), st.integers(0, 1 << 22))
def test_tokens_grow_by_growth_or_to_what_is_needed(capacity, needed):
    grown = grown_tokens(capacity, needed)
    assert grown == (capacity if needed <= capacity else max(int(capacity * GROWTH), needed))


@given(st.integers(0, 1 << 20), st.integers(0, 1 << 22))
def test_a_table_grows_by_growth_until_at_most_max_load_full(capacity, needed):
    grown = grown_table(capacity, needed)
    assert needed <= MAX_LOAD * grown
    step = capacity
    while step < grown:
        assert needed > MAX_LOAD * step  # the first growth step that holds them
        step = max(int(step * GROWTH), step + 1)
    assert step == grown


def test_a_token_index_grows_by_the_rule():
    index = TokenIndex(min_ngram=1, max_ngram=4)
    buffers = index.buffers()
    rng = np.random.default_rng(0)
    for _ in range(40):
        tokens, table, n, used = buffers.tokens.shape[0], buffers.table.shape[0], buffers.n, index._used
        index.extend(rng.integers(0, 1000, size=int(rng.integers(1, 200))))  # under one chunk: one reserve
        buffers = index.buffers()
        assert buffers.tokens.shape[0] == grown_tokens(tokens, buffers.n)
        ends = buffers.n - 1 - max(n - 1, 0)  # end positions indexed, each adding at most 4 slots
        assert buffers.table.shape[0] == grown_table(table, used + ends * 4)


def test_the_engine_grows_a_slot_by_the_rule():
    slots = Slots(2, 4, 1, 4, min_tokens=16, min_table=32)
    s = slots.allocate(prompt_len=10, doc=-1, first_token=1, tokens=10)
    at = slots.index.at
    assert at[s, TABLE_CAP] == grown_table(32, int(HEADROOM * 10) * 4)  # its planned tokens, each adding at most 4 slots
    n = int(at[s, TOKEN_CAP]) + 5  # past its tokens' region
    none = np.zeros(1, np.int64)
    rows = rows_group(slot=np.array([s]), num_tokens=np.array([n]), num_sampled=np.array([1]), verified=none, theirs=none,
                      room=np.zeros(1, np.int64), token_ids=np.zeros((1, n), np.int32))
    new_tokens, new_table = np.zeros(1, np.int64), np.zeros(1, np.int64)
    decode, grows = engine_kernels.room_and_growth(rows, slots.cols, at, 4, 1 << 20, 4, new_tokens, new_table)
    assert (decode, grows) == (1, 1)
    assert new_tokens[0] == grown_tokens(int(at[s, TOKEN_CAP]), n + 1)
    table = grown_table(int(at[s, TABLE_CAP]), n * 4)  # nothing indexed yet
    assert new_table[0] == (table if table > at[s, TABLE_CAP] else 0)
