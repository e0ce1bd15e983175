import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead import TokenIndex
from lookahead.index import SEPARATOR, as_id_set, kernels
from tests import reference


def test_warm_up_compiles_every_kernel():
    assert kernels.warm_up() == 3  # the suffix [3, 1, 4] occurred at the start
    for kernel in (kernels.index_ends, kernels.rehash, kernels.match_ends):
        assert kernel.signatures, f"{kernel.__name__} was not compiled"


def match_ends(index: TokenIndex) -> list[int]:
    """ends[g] = most recent earlier end of the g-token suffix (-1: none), from the kernel the drafts use."""
    buffers = index.buffers()
    ends = np.zeros(buffers.max_ngram + 1, dtype=np.int64)
    kernels.match_ends(tuple(buffers), buffers.tokens, buffers.n, ends)
    return ends.tolist()


# One operation on the index: ("extend", tokens) or ("clear", None), as a drafter's reset does.
operations = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.lists(st.integers(0, 5), min_size=0, max_size=40)),
        st.tuples(st.just("clear"), st.none()),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(ops=operations, min_ngram=st.integers(1, 4), extra=st.integers(0, 5))
def test_longest_match_equals_brute_force(ops, min_ngram, extra):
    max_ngram = min_ngram + extra
    index = TokenIndex(min_ngram=min_ngram, max_ngram=max_ngram)
    seq = []
    for op, arg in ops:
        if op == "extend":
            # one token at a time and in bulk take different paths through extend
            if len(arg) % 2:
                for t in arg:
                    index.append(t)
            else:
                index.extend(arg)
            seq.extend(arg)
        else:
            index.clear()
            seq = []
        assert index.tokens.tolist() == seq
        assert index.longest_match() == reference.longest_match(seq, min_ngram, max_ngram)
        ends = match_ends(index)
        for g in range(min_ngram, max_ngram + 1):
            expected = reference.longest_match(seq, g, g)
            assert ends[g] == (expected[1] if expected[0] else -1)


def test_long_random_stream_matches_brute_force_at_every_step():
    # Grows the table many times over; checks every prefix's answer.
    rng = np.random.default_rng(0)
    seq = rng.integers(0, 8, 3000).tolist()
    index = TokenIndex(min_ngram=2, max_ngram=6)
    for i, t in enumerate(seq):
        index.append(t)
        if i % 7 == 0 or i > 2900:
            assert index.longest_match() == reference.longest_match(seq[: i + 1], 2, 6), i


def test_bulk_extend_past_a_chunk_equals_appends():
    rng = np.random.default_rng(1)
    seq = rng.integers(0, 30, 10_000)
    bulk, single = TokenIndex(min_ngram=1, max_ngram=8), TokenIndex(min_ngram=1, max_ngram=8)
    bulk.extend(seq)
    for t in seq:
        single.append(int(t))
    for tail in ([1, 2, 3], [7], [4, 4, 4, 4]):
        bulk.extend(tail)
        single.extend(tail)
        assert bulk.longest_match() == single.longest_match()
    assert bulk.longest_match() == reference.longest_match(bulk.tokens.tolist(), 1, 8)


def test_continuation_and_min_ngram_override():
    index = TokenIndex(min_ngram=1, max_ngram=4)
    index.extend([9, 1, 2, 3, 9, 1, 2, 7, 1])
    assert index.longest_match() == (1, 5)  # [1] most recently ended at 5
    assert index.continuation(5, 10).tolist() == [2, 7, 1]
    assert match_ends(index) == [-1, 5, -1, -1, -1]


def test_external_query_finds_any_occurrence():
    index = TokenIndex(min_ngram=1, max_ngram=3)
    index.extend([4, 5, 6, 7, 9])
    assert index.longest_match([1, 5, 6]) == (2, 2)  # [5, 6] ends at 2
    # Grams ending at the index's last position are not searchable (stores end each
    # sequence with a separator for this reason).
    assert index.longest_match([7, 9]) == (0, -1)
    assert index.longest_match([2, 6, 7]) == (2, 3)


def test_a_sequence_end_is_never_matched_across():
    index = TokenIndex(min_ngram=1, max_ngram=4)
    index.extend([4, 5])
    index.end_sequence()
    index.extend([6, 5])
    assert index.longest_match() == (1, 1)  # [5] at 1; [6, 5] and [SEPARATOR, 6, 5] occur nowhere before
    assert index.continuation(1, 4).tolist() == [SEPARATOR, 6, 5]
    assert index.longest_match([5, SEPARATOR - 1]) == (0, -1)


def test_memory_stays_under_64_bytes_per_token_on_random_tokens():
    # Random tokens are the worst case: every gram is new.
    index = TokenIndex(min_ngram=2, max_ngram=8)
    index.extend(np.random.default_rng(2).integers(0, 50_000, 200_000))
    assert index.nbytes / len(index) <= 64


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(min_ngram=0, max_ngram=3), ValueError, "min_ngram=0"),
        (dict(min_ngram=4, max_ngram=3), ValueError, "max_ngram=3"),
        (dict(min_ngram=1, max_ngram=17), ValueError, "max_ngram=17"),
        (dict(min_ngram=1.5, max_ngram=3), TypeError, "1.5"),
    ],
)
def test_bad_options_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        TokenIndex(**kwargs)


@pytest.mark.parametrize(
    "tokens, error, message",
    [
        ([[1, 2]], ValueError, "1-D"),
        ([1.5, 2.0], TypeError, "float64"),
        ([1, -3], ValueError, "-3"),
        ([2**31], ValueError, str(2**31)),
        ([2**31 - 1], ValueError, str(2**31 - 1)),  # reserved: the separator (regression: once accepted, then every reset failed)
        ("abc", TypeError, "str"),
        ({1, 2}, TypeError, "set"),
        ((t for t in [1, 2]), TypeError, "generator"),
        ([[1, 2], [3]], ValueError, "ragged"),
    ],
)
def test_bad_tokens_are_refused_and_leave_the_index_unchanged(tokens, error, message):
    index = TokenIndex()
    index.extend([1, 2, 3])
    with pytest.raises(error, match=message):
        index.extend(tokens)
    assert index.tokens.tolist() == [1, 2, 3]


BAD_IDS = [
    ("abc", TypeError, "got str"),
    ({1, 2}, TypeError, "got set"),
    ((t for t in [1, 2]), TypeError, "got generator"),
    ([[1, 2], [3]], ValueError, "ragged"),
    ("bfloat16", TypeError, "dtype torch.bfloat16"),
    ([1, 2**31 - 1], ValueError, "got 2147483647 at position 1"),
]


def public_entries():
    from lookahead import DocumentLibrary, LookupDrafter, TokenStore

    drafter = LookupDrafter()
    library = DocumentLibrary()
    library.add([1, 2, 3])
    return {"reset": drafter.reset, "extend": drafter.extend, "add_document": drafter.add_document,
            "TokenStore.add": TokenStore().add, "DocumentLibrary.add": library.add, "DocumentLibrary.select": library.select}


@pytest.mark.parametrize("entry", list(public_entries()))
@pytest.mark.parametrize("tokens, error, message", BAD_IDS, ids=["str", "set", "generator", "ragged", "bfloat16", "separator"])
def test_every_public_entry_refuses_bad_ids_with_our_message(entry, tokens, error, message):
    if tokens == "bfloat16":
        import torch

        tokens = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    if isinstance(tokens, type(t for t in [])):
        tokens = (t for t in [1, 2])  # a fresh one per case
    with pytest.raises(error, match=message) as raised:
        public_entries()[entry](tokens)
    assert raised.traceback[-1].path.name == "token_index.py"  # raised by as_token_ids, not inside numpy or torch


@pytest.mark.parametrize(
    "ids, expected",
    [(None, set()), (5, {5}), (np.int32(5), {5}), (np.array(5), {5}), (np.array([5, 2, 5]), {2, 5}), ((2, 5), {2, 5}), ([], set())],
)
def test_as_id_set_reads_every_shape_of_eos_token_id(ids, expected):
    assert as_id_set(ids) == expected and all(type(t) is int for t in as_id_set(ids))


@pytest.mark.parametrize("ids", [[1, 2.0], ["1"], [[1]], 1.5])
def test_as_id_set_refuses_non_ints_and_names_them(ids):
    with pytest.raises(TypeError, match=re.escape(repr(ids))):
        as_id_set(ids)
