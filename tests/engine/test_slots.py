"""The keep rate of a slot of engine.slots.Slots (engine.kernels' learn_row, settle_row and keep_chance), beside its
plain-Python mirror (tests/reference.py's KeepRate): what it learns from kept, failed and watched tokens, and the
sizes it gives.
"""

import numpy as np
import pytest

from lookahead.sizing.cost import CostCurve
from lookahead.engine import kernels
from lookahead.engine.slots import Slots
from lookahead.sizing.rules import chain_size
from tests.reference import KeepRate as MirrorKeepRate


LINEAR = CostCurve(1 + 0.1 * np.arange(66.0))  # verifying n tokens costs 1 + 0.1 n


class KeepRate:
    """The engine's keep rate (one slot of engine.slots.Slots, engine.kernels' learn_row and settle_row) behind
    the mirror's interface (tests.reference.KeepRate): what these tests hold of both."""

    def __init__(self, max_ngram: int):
        self.slots = Slots(1, 16, 1, max_ngram, indexes=False)
        self.slots.allocate(0, -1, -1)

    def keep_chance(self, match_len: int) -> float:
        return kernels.keep_chance(self.slots.keep, self.slots.overall, 0, match_len)

    def observe(self, match_len, draft_ids, verified, written, position) -> None:
        """The mirror's observe, then its settle against the tokens written (what Request.verified does in one)."""
        self.slots.widen(len(draft_ids))
        kernels.plan_row(self.slots.state(), 0, np.asarray(draft_ids), len(draft_ids), verified, match_len, position)
        row = np.asarray([-1] * position + list(written), dtype=np.int64)
        kernels.learn_row(self.slots.state(), 0, row, row.shape[0], len(written), verified)

    def settle(self, sequence) -> None:
        row = np.asarray(sequence, dtype=np.int64)
        kernels.settle_row(self.slots.state(), 0, row, row.shape[0])

    @property
    def kept(self) -> list:
        return self.slots.keep[0, :, 0].tolist()

    @property
    def failed(self) -> list:
        return self.slots.keep[0, :, 1].tolist()


class SettledMirror(MirrorKeepRate):
    def observe(self, match_len, draft_ids, verified, written, position) -> None:
        super().observe(match_len, draft_ids, verified, written, position)
        self.settle([-1] * position + list(written))


@pytest.fixture(params=[KeepRate, SettledMirror], ids=["engine", "mirror"])
def keep_rate(request):
    return request.param


def size(keep, match_len: int, available: int, cost=LINEAR) -> int:
    return chain_size(keep.keep_chance(match_len), available, cost)


def test_sizes_grow_with_acceptance_and_vanish_without_it(keep_rate):
    sizer = keep_rate(max_ngram=8)
    assert 0 < size(sizer, 8, 16) < 16  # prior 0.5: a few tokens
    for _ in range(20):
        sizer.observe(8, list(range(16)), 16, list(range(17)), 0)
    assert size(sizer, 8, 16) == 16
    for _ in range(40):
        sizer.observe(2, list(range(16)), 4, [99], 0)
    assert size(sizer, 2, 16) == 0  # a plain step
    assert size(sizer, 8, 16) == 16  # buckets are separate


def test_unverified_rest_of_a_cut_draft_teaches_as_the_output_shows_it(keep_rate):
    sizer = keep_rate(max_ngram=4)
    before = sizer.keep_chance(4)
    sizer.observe(4, [7, 8, 9, 10], 1, [7], position=5)  # verified [7]; [8, 9, 10] watched at 6
    assert (sizer.kept[4], sizer.failed[4]) == (1, 0)
    assert sizer.keep_chance(4) > before
    sequence = [0] * 5 + [7, 8, 9]
    sizer.settle(sequence)  # 8 and 9 agree, 10 not yet written: counted, still watched
    assert (sizer.kept[4], sizer.failed[4]) == pytest.approx((0.9 + 2, 0))
    sizer.settle(sequence)  # nothing new: nothing counted twice, nothing faded
    assert (sizer.kept[4], sizer.failed[4]) == pytest.approx((0.9 + 2, 0))
    sizer.settle(sequence + [3])  # the model wrote 3 where the draft said 10: the failure
    assert (sizer.kept[4], sizer.failed[4]) == pytest.approx((0.9 * (0.9 + 2), 1))
    sizer.settle(sequence + [3, 10])  # no longer watched: a later 10 teaches nothing
    assert (sizer.kept[4], sizer.failed[4]) == pytest.approx((0.9 * (0.9 + 2), 1))


def test_a_rarely_seen_match_length_leans_on_the_overall_rate(keep_rate):
    sizer = keep_rate(max_ngram=8)
    assert sizer.keep_chance(6) == 0.5
    for m in (2, 3, 4, 5):  # a request's first steps: each anchored on a longer match, each kept
        sizer.observe(m, [1, 2, 3, 4], 4, [1, 2, 3, 4, 5], 0)
    assert sizer.keep_chance(6) > 0.8  # never seen, yet most drafts were kept
    for _ in range(5):
        sizer.observe(7, [1, 2, 3, 4], 4, [9], 0)
    assert sizer.keep_chance(7) < 0.3 < sizer.keep_chance(5)  # its own counts outweigh the rate


def test_a_tree_step_teaches_through_the_chain_it_holds(keep_rate):
    sizer = keep_rate(max_ngram=4)
    # the tree step verified 4 chain tokens' worth; the model wrote 7, 8, 5: the chain failed at its third token
    sizer.observe(2, [7, 8, 9, 10], 4, [7, 8, 5], position=0)
    assert (sizer.kept[2], sizer.failed[2]) == (2, 1)
    sizer.settle([7, 8, 5, 10])  # the failed chain's rest is not watched
    assert (sizer.kept[2], sizer.failed[2]) == (2, 1)
    # the model wrote only 2 tokens, both the chain's: no failure seen yet, the rest watched
    sizer.observe(3, [7, 8, 9, 10], 4, [7, 8], position=0)
    assert (sizer.kept[3], sizer.failed[3]) == (2, 0)
    sizer.settle([7, 8, 9, 10])  # watched from position 2: both kept
    assert (sizer.kept[3], sizer.failed[3]) == pytest.approx((0.9 * 2 + 2, 0))
