"""Cost-aware draft sizing (lookahead.sizing) and the verify-cost calibration."""

import itertools
import math

import numpy as np
import pytest
import torch

from lookahead import LookupDrafter, verify_costs
from lookahead.bench import replay
from lookahead.integrations import calibration
from lookahead.integrations.calibration import step_costs, tree_over_chain_16
from lookahead.sizing.cost import ONCE_DEAREST, UNPRICED, CostCurve, LineCost, LoopCosts, StepCosts, cost_curve
from lookahead.engine import kernels
from lookahead.engine.slots import Slots
from lookahead.predictions import TreeChances
from lookahead.sizing.rules import MIN_GAIN, SURE, TREE_WORTH_TOLERANCE, best_chain, chain_size, static_batch_draft_sizes, tree_gain, tree_nodes, tree_size
from tests.models import SHARED, tiny_model
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


def test_tree_nodes_cost_no_more_than_the_chain_would():
    assert tree_nodes(4, 64, CostCurve(np.ones(66))) == 64  # verification free: every node
    gpu = np.ones(66)
    gpu[17:] = 1.05  # 16 tokens for the price of 1, wider blocks a little dearer
    assert tree_nodes(4, 64, CostCurve(gpu)) == 15
    assert tree_nodes(20, 64, CostCurve(gpu)) == 64
    steep = 1 + 0.1 * np.arange(66.0)
    assert tree_nodes(4, 64, CostCurve(steep)) == 4  # every node costs: the chain's size
    plateau = np.maximum(1.0, 1 + 0.1 * (np.arange(66.0) - 8))  # 8 tokens for the price of 1, then rising
    assert tree_nodes(3, 64, CostCurve(plateau)) == 7
    assert tree_nodes(12, 64, CostCurve(plateau)) == 12
    assert tree_nodes(0, 64, CostCurve(steep)) == 0


def test_tree_size_is_the_widest_count_of_likeliest_nodes_within_the_tolerance_of_the_best():
    rng = np.random.default_rng(3)
    for _ in range(300):
        curve = CostCurve(np.concatenate([[1.0], np.maximum.accumulate(1 + rng.uniform(0, 0.3, 65).round(2))]))
        chances = np.sort(rng.uniform(0, 1, int(rng.integers(0, 65))) ** 3)[::-1]
        worth = (1 + np.concatenate([[0.0], np.cumsum(chances)])) / curve.cost(1, np.arange(1, chances.shape[0] + 2))
        assert tree_size(chances, curve) == np.flatnonzero(worth >= worth.max() * (1 - TREE_WORTH_TOLERANCE))[-1]
    flat = np.array([0.5] + [0.006] * 63)  # a GPU's price: past the first node, each adds about what it costs
    worth = (1 + np.concatenate([[0.0], np.cumsum(flat)])) / LineCost(200.0).cost(1, np.arange(1, 66))
    assert int(np.argmax(worth)) == 1 and 10 < tree_size(flat, LineCost(200.0)) < 64  # nearly as worth it: the wider
    chances = np.array([0.6, 0.3, 0.05, 0.01])
    assert tree_size(chances, CostCurve(np.ones(66))) == 4  # verifying free: every node that may be written
    assert tree_size(chances, LineCost(200.0)) == 4  # a GPU at one row (20 ms a step, 0.1 ms a token)
    assert tree_size(chances, LineCost(5.0)) == 2  # a CPU: the likely ones
    assert tree_size(chances, LineCost(0.5)) == 0  # every token dear: a plain step


def test_a_trees_gain_is_its_expected_tokens_per_price_over_its_chains():
    chain = 0.5 ** np.arange(1, 5)  # a chain's nodes: kept with 0.5 each, given those before
    assert tree_gain(chain, 0.5, 4, LineCost(200.0)) == pytest.approx(1.0)  # the same nodes: no gain
    wider = np.concatenate([chain, [0.3, 0.2]])  # and two branches
    free, dear = CostCurve(np.ones(66)), LineCost(0.5)
    assert tree_gain(wider, 0.5, 4, free) == pytest.approx((1 + wider.sum()) / (1 + chain.sum()))
    assert tree_gain(wider, 0.5, 4, dear) == pytest.approx((1 + wider.sum()) / dear.cost(1, 7) / ((1 + chain.sum()) / dear.cost(1, 5)))
    assert tree_gain(wider, 0.5, 4, dear) < 1.0 < tree_gain(wider, 0.5, 4, free)


def test_tree_chances_learn_what_each_band_of_estimates_keeps_per_source():
    chances = TreeChances()

    def corrected(estimates, table):
        _, bands, errors = chances.correction(0)
        return np.clip(estimates + errors[np.asarray(table, dtype=np.int64), np.searchsorted(bands, estimates, side="right")], 0, 1)

    estimates = np.array([0.002, 0.05, 0.5])
    prior = TreeChances.PRIOR_ERROR
    assert corrected(estimates, [0, 0, 1]).tolist() == pytest.approx([0.002 + prior[0], 0.05 + prior[2], 0.5 + prior[-1]])  # the prior's guess
    for _ in range(1000):  # thin nodes kept 5% of the time, the likely one half as often as estimated; the table's likely one never
        chances.observe(np.array([0.002] * 20 + [0.5, 0.5]), np.array([False] * 21 + [True]),
                        np.array([True] + [False] * 19 + [bool(_ % 2 and _ % 4 == 1), False]))
    assert corrected(estimates, [0, 0, 0]).tolist() == pytest.approx([0.05, 0.05 + prior[2], 0.25], abs=0.02)
    shrunk = (0.5 + prior[-1]) * TreeChances.PRIOR_NODES / (1000 + TreeChances.PRIOR_NODES)  # the table's: never kept, the prior's pull left
    assert corrected(np.array([0.002, 0.5]), [1, 1]).tolist() == pytest.approx([0.002 + prior[0], shrunk])
    assert corrected(np.array([0.001, 0.99]), [0, 1]).min() >= 0.0 and corrected(np.array([0.99]), [0]).max() <= 1.0
    assert chances.correction(7)[0] == 7


def test_calibration_is_relative_to_one_token_and_cached():
    model = tiny_model("llama")
    costs = verify_costs(model)
    assert costs.shape == (65,) and costs[1] == 1.0 and (costs[1:] > 0).all()
    assert (verify_costs(model) == costs).all()
    assert step_costs(model).relative()[1] == 1.0
    assert tree_over_chain_16(model) > 0


def test_calibration_keeps_each_width_fastest_round_and_never_prices_a_wider_block_below_one_token(monkeypatch):
    model = tiny_model("llama")
    monkeypatch.setattr(calibration, "CALIBRATED", {})  # calibrated afresh, and the cache restored afterwards
    widths = []  # the block width of each forward pass, in order
    forward = type(model).__call__
    monkeypatch.setattr(type(model), "__call__", lambda self, **kw: widths.append(kw["input_ids"].shape[1]) or forward(self, **kw))

    def scripted(model, run):
        # Made-up step times: width w costs 0.1 + 0.01 * w s, but another process stalls two of
        # the three timed rounds of one token (+5 s; the first round warms up; a median would
        # keep a stalled one) and width 64 reads 20x too fast.
        run()
        width = widths[-1]
        if width == 64:
            return 0.005
        return 0.1 + 0.01 * width + (5.0 if width == 1 and widths.count(1) in (2, 3) else 0.0)

    monkeypatch.setattr(calibration, "timed_forward", scripted)
    costs = verify_costs(model)
    assert costs[1] == 1.0
    assert costs[16] == pytest.approx((0.1 + 0.16) / 0.11)  # the stalled rounds did not count
    assert costs[64] == 1.0  # measured 20x cheaper than one token: priced as one token
    assert tree_over_chain_16(model) == pytest.approx(1.0)  # the tree's 16 nodes cost what 16 chain tokens do


def test_the_calibrated_tree_and_chain_steps_are_our_loops_and_leave_the_cache_as_found(monkeypatch):
    from lookahead.draft import Draft
    from lookahead.integrations import row_cache
    from lookahead.integrations.hf import cache_inputs, new_cache

    model = tiny_model("llama")
    prefix = list(range(3, 40))
    gathered = []  # tail gathers: a tree step packs its kept path to the block's front
    gather = row_cache.gather_cache_tail
    monkeypatch.setattr(row_cache, "gather_cache_tail", lambda *args: gathered.append(1) or gather(*args))
    with torch.inference_mode():
        cache = new_cache(model)
        model(input_ids=torch.tensor([prefix]), **cache_inputs(model, cache))
        nodes = np.arange(16, dtype=np.int64) + 50
        chain, tree = Draft.chain(nodes, 8), Draft(nodes, np.array([-1, *range(7), -1, *range(8, 15)]), 8)
        for draft, kept, gathers in ((chain, list(range(9)), 0), (tree, [0, *range(9, 17)], 1)):
            assert calibration.loop_step(model, cache, prefix, draft, kept, torch.float32) > 0
            assert cache.get_seq_length() == len(prefix) and len(gathered) == gathers


SECONDS = np.array([0.10, 0.10, 0.12, 0.16, 0.24, 0.40, 0.72])  # a calibration: 16 tokens cost 2.4x one


def taught(costs: StepCosts, width: int, seconds: float) -> None:
    """Steps at `width` taking `seconds`: a warm-up step (not learnt from), then enough to be measured."""
    costs.observe(1, width, 10 * seconds)
    for _ in range(StepCosts.MEASURED):
        costs.observe(1, width, seconds)


def test_a_widths_first_step_is_a_warm_up_not_its_price():
    costs = StepCosts(SECONDS)
    taught(costs, 1, 0.10)
    costs.observe(1, 16, 5.0)  # torch's first forward at this shape: one-time costs
    assert not costs.seen[16] and costs.relative()[16] == pytest.approx(SECONDS[4] / 0.10)
    costs.observe(1, 16, 0.3)  # one step prices it ...
    assert not costs.seen[16] and costs.relative()[16] == pytest.approx(3.0)
    costs.observe(1, 16, 0.35)  # ... MEASURED steps: the least of them
    assert costs.seen[16] and costs.relative()[16] == pytest.approx(3.0)


def test_one_stalled_step_prices_a_width_at_most_twice_its_unseen_price():
    costs = StepCosts(SECONDS)
    taught(costs, 1, 0.10)
    costs.observe(1, 16, 0.3)  # the warm-up
    costs.observe(1, 16, 5.0)  # a stall
    assert costs.relative()[16] == pytest.approx(ONCE_DEAREST * SECONDS[4] / 0.10)
    costs.observe(1, 16, 0.25)
    assert costs.relative()[16] == pytest.approx(2.5)  # the least of its steps


def test_step_costs_start_from_the_calibration():
    assert StepCosts(SECONDS).relative()[[1, 2, 4, 8, 16, 32, 64]] == pytest.approx(SECONDS / 0.10)


def test_a_slower_plain_step_makes_unseen_wide_blocks_relatively_cheaper():
    costs = StepCosts(SECONDS)
    taught(costs, 1, 0.30)  # a long context: the plain step costs 3x the calibrated one
    relative = costs.relative()
    # a block of 16 adds the calibration's 0.14 s of compute on top: (0.30 + 0.14) / 0.30
    assert relative[16] == pytest.approx((0.30 + 0.14) / 0.30)
    assert relative[16] < SECONDS[4] / SECONDS[0]


def test_measured_wide_blocks_are_not_smoothed_and_noise_is_no_cost():
    costs = StepCosts(SECONDS)
    for width, seconds in [(1, 0.10), (4, 0.104), (16, 0.09), (32, 0.30)]:
        taught(costs, width, seconds)
    relative = costs.relative()
    assert relative[4] == pytest.approx(1.04)  # a drafted width is never levelled to a plain step
    assert relative[16] == pytest.approx(0.9)  # measured cheaper: stays cheaper
    assert relative[32] == pytest.approx(3.0)
    costs.observe(1, 32, 0.10)  # the least of its last steps
    assert costs.relative()[32] == pytest.approx(1.0)
    for _ in range(StepCosts.WINDOW):
        costs.observe(1, 32, 0.20)  # a longer context: the older steps leave the window
    assert costs.relative()[32] == pytest.approx(2.0)


def test_each_width_is_priced_by_its_own_steps():
    # float32 on a CPU: the BLAS picks a kernel per shape, so 3 tokens can cost more than 4
    costs = StepCosts(SECONDS)
    for width, seconds in [(1, 0.10), (3, 0.30), (4, 0.20), (8, 0.18)]:
        taught(costs, width, seconds)
    relative = costs.relative()
    assert relative[3] == pytest.approx(3.0) and relative[4] == pytest.approx(2.0)
    assert relative[2] == pytest.approx(1.0)  # unseen: as the seen narrower one plus the calibration's extra (none)
    assert relative[6] == pytest.approx(1.8)  # unseen: never dearer than a seen wider block
    sizer = KeepRate(max_ngram=8)
    for _ in range(10):
        sizer.observe(8, list(range(16)), 16, list(range(17)), 0)  # drafts are kept
    assert size(sizer, 8, 2, costs) == 1  # 2 drafted tokens would take the dear width 3
    assert size(sizer, 8, 7, costs) == 7  # the cheap width 8 is found between the powers of two


def test_the_sizer_follows_the_step_times_it_is_taught():
    costs, sizer = StepCosts(np.array([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4])), KeepRate(max_ngram=8)  # every token costs
    for _ in range(10):
        sizer.observe(8, list(range(16)), 16, list(range(17)), 0)  # drafts are kept
    dear = size(sizer, 8, 16, costs)
    for width in (1, 2, 4, 8, 16):
        taught(costs, width, 0.1)  # on this machine now, blocks up to 16 cost what one token does
    assert size(sizer, 8, 15, costs) == 15 > dear  # 15 drafted + its own token: the widest block taught cheap


def test_one_row_prices_as_cost_does_for_every_cost_model():
    # one_row is the sizer's per-step path (plain Python, only the widths asked for); cost() the array one
    rng = np.random.default_rng(1)
    learnt = StepCosts(SECONDS)
    for _ in range(200):
        learnt.observe(1, int(rng.choice([1, 2, 3, 4, 7, 9, 16, 20, 64, 80])), float(rng.uniform(0.05, 0.4)))
        for last in (1, 5, 17, 64, 90):
            assert learnt.one_row(last) == pytest.approx(learnt.cost(1, np.arange(last + 1)), rel=1e-12)
    for model in (LINEAR, LineCost(7.0), StepCosts(SECONDS)):
        for last in (2, 17, 64, 90):
            assert model.one_row(last) == pytest.approx(model.cost(1, np.arange(last + 1)), rel=1e-12)


def test_chain_size_is_the_first_best_width():
    rng = np.random.default_rng(2)
    for _ in range(300):
        curve = CostCurve(np.concatenate([[1.0], np.maximum.accumulate(1 + rng.uniform(0, 0.3, 65).round(1))]))
        a, available = float(rng.uniform(0, 1)), int(rng.integers(0, 70))
        widths, capped = np.arange(1, available + 2), min(a, 0.999)
        worth = (1 - capped**widths) / (1 - capped) / curve.cost(1, widths)  # E(n) / cost(1, n + 1) over every n at once
        best = int(np.argmax(worth))  # argmax: the first of equals
        assert chain_size(a, available, curve) == (best if worth[best] > (1 + MIN_GAIN) * worth[0] else 0)  # beating a plain step by MIN_GAIN


@pytest.mark.parametrize("points", [[1, 2, 3], [2, 2, 2, 2, 2, 2, 2], [1, 1, float("nan"), 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, -1]])
def test_bad_cost_curves_are_refused(points):
    with pytest.raises(ValueError, match="cost curve"):
        cost_curve(points)


def kept_distribution(a: float, m: int) -> list[float]:
    """P(a row keeps k of m verified drafted tokens), k = 0..m: each kept with chance a after the ones before."""
    return [a**k * (1 - a) for k in range(m)] + [a**m]


def brute_static_sizes(chances, lengths, remaining, rates, h):
    """Every block width tried, the rows behind's least gain by enumerating their joint outcomes."""
    steps = [r / e for r, e in zip(remaining, rates)]
    behind = [i for i, n in enumerate(steps) if n >= max(steps) - 1]
    best, best_worth = 0, -1.0
    for drafted in range(max(lengths) + 1):
        depth = [min(n, drafted) for n in lengths]
        expected = sum(sum(k * p for k, p in enumerate(kept_distribution(a, m))) + 1 for a, m in zip(chances, depth))
        least = 0.0
        for outcome in itertools.product(*(range(depth[i] + 1) for i in behind)):
            chance = math.prod(kept_distribution(chances[i], depth[i])[k] for i, k in zip(behind, outcome))
            least += chance * min(outcome)
        worth = (h * (1 + least) + expected) / (h + len(chances) * (drafted + 1))
        if drafted == 0 and len(chances) == 1:
            worth *= 1 + MIN_GAIN  # one row: chain_size's rule, a draft beats a plain step by MIN_GAIN
        if worth > best_worth + 1e-12:
            best, best_worth = drafted, worth
    return [min(n, best) for n in lengths]


def test_static_batch_sizes_equal_trying_every_width():
    rng = np.random.default_rng(0)
    for _ in range(300):
        rows = int(rng.integers(1, 6))
        chances = rng.uniform(0, 0.99, rows).tolist()
        lengths = rng.integers(0, 6, rows).tolist()
        remaining = rng.choice([8, 30, 31, 60], rows).tolist()
        rates = rng.choice([1.0, 1.0, 1.5, 2.0], rows).tolist()
        h = float(rng.choice([1.0, 4.0, 16.0, 64.0, 1000.0]))
        got = static_batch_draft_sizes(chances, lengths, remaining, rates, cost=LineCost(h))
        assert got == brute_static_sizes(chances, lengths, remaining, rates, h)


def test_static_batch_sizes_for_one_row_maximise_its_tokens_per_unit_of_time():
    for a, n, h in itertools.product([0.1, 0.5, 0.8, 0.95], [1, 4, 16], [1.0, 8.0, 64.0]):
        best = max(range(n + 1), key=lambda d: (sum(a**j for j in range(d + 1)) / (h + d + 1), -d))
        assert static_batch_draft_sizes([a], [n], [64], [1.0], cost=LineCost(h)) == [best]


def test_static_batch_drafts_shrink_as_the_batch_grows_and_follow_the_rows_behind():
    widths = [max(static_batch_draft_sizes([0.9] * rows, [16] * rows, [64] * rows, [1.0] * rows, cost=LineCost(16.0)))
              for rows in (1, 2, 4, 8, 16, 64)]
    assert widths == sorted(widths, reverse=True) and widths[0] >= 4 and widths[-1] == 0
    # idle hardware: whole drafts where the row behind is likely to keep them
    assert static_batch_draft_sizes([0.95] * 16, [16] * 16, [64] * 16, [2.0] * 15 + [1.0], cost=LineCost(4096.0)) == [16] * 16
    # one row far behind: its draft decides; the others' only buy their own share
    ahead = [0.1] * 7
    assert max(static_batch_draft_sizes(ahead + [0.9], [8] * 8, [20] * 7 + [60], [1.0] * 8, cost=LineCost(16.0))) >= 4
    assert static_batch_draft_sizes([0.9] * 7 + [0.05], [8] * 8, [20] * 7 + [60], [1.0] * 8, cost=LineCost(16.0)) == [0] * 8
    with pytest.raises(ValueError, match="fixed_cost_tokens"):
        LineCost(0.0)
    with pytest.raises(ValueError, match="one entry per row"):
        static_batch_draft_sizes([0.5, 0.5], [3, 3], [8], [1.0], cost=LineCost(4.0))


TRACES = SHARED / "traces"


def fixed_length_tokens_per_cost(requests, costs, k: int) -> float:
    """Tokens per unit of modelled verify cost when every step verifies the drafter's chain cut at k tokens."""
    drafter = LookupDrafter(memory=False, num_draft_tokens=k)
    cost = tokens = 0.0
    for request in requests:
        drafter.reset(request.prompt)
        output, pos = request.output, 0
        while pos < output.shape[0]:
            draft = drafter.propose(min(k, output.shape[0] - pos - 1)).token_ids
            kept = replay.kept_prefix(draft, output, pos)
            cost, tokens = cost + costs[draft.shape[0] + 1], tokens + kept + 1
            drafter.extend(output[pos : pos + kept + 1])
            pos += kept + 1
    return tokens / cost


@pytest.mark.skipif(not TRACES.is_dir(), reason="needs ../shared/traces (recorded outputs)")
@pytest.mark.parametrize("curve", ["1,1,1,1,1.02,1.05,1.2", "1,1,1,1,1.19,1.65,3.39", "1,2.05,2.05,2.05,2.05,2.5,3.5", "1,2,4,8,16,32,64"],
                         ids=["gpu-like", "flat-to-8", "float32-cpu", "linear"])
def test_on_recorded_outcomes_the_sizer_matches_the_best_fixed_draft_length_in_hindsight(curve):
    # Recorded step outcomes (Llama-3.1-8B's real outputs), not the sizer's own keep model:
    # under each cost regime the sizer, which learns as it goes, gets within 3% of the draft
    # length that was best for that file in hindsight, or of never drafting (1 token per cost).

    costs = replay.parse_costs(curve)
    for path in sorted(TRACES.glob("*.dev.jsonl")):
        requests = replay.load_trace(path)[:4]
        sized = replay.replay_lookahead(requests, LookupDrafter(memory=False), costs=costs)
        best = max([1.0] + [fixed_length_tokens_per_cost(requests, costs, k) for k in (1, 2, 4, 8, 16, 63)])
        assert sized["tokens"] / sized["cost"] >= 0.97 * best, path.name


def test_unseeded_costs_price_no_draft_until_the_prefill_and_a_plain_step_draw_the_chord():
    costs = StepCosts()
    assert costs.one_row(4).tolist() == [1.0, 1.0, UNPRICED, UNPRICED, UNPRICED]
    assert chain_size(0.99, 16, costs) == 0  # nothing priced: a plain step
    costs.observe_prefill(1, 201, 2.1)  # the prompt: 201 tokens in 2.1 s
    assert costs.one_row(4)[2] == UNPRICED  # one point is no chord
    taught(costs, 1, 0.1)  # plain steps: the chord adds (2.1 - 0.1) / 200 = 0.01 s per token
    assert costs.relative()[[1, 2, 11, 64]] == pytest.approx([1.0, 1.1, 2.0, 7.3])
    assert chain_size(0.99, 16, costs) > 0
    taught(costs, 11, 0.12)  # a measured width is priced by its steps, and anchors the wider ones
    assert costs.relative()[[11, 12]] == pytest.approx([1.2, 1.22])  # by the seen widths' line, less steep than the chord


def test_seen_widths_price_the_unseen_ones_by_their_own_line_where_the_chord_is_steeper():
    costs = StepCosts()
    costs.observe_prefill(1, 21, 0.1 + 20 * 0.01)  # a short prefill: the chord adds 0.01 s a token
    taught(costs, 1, 0.1)
    assert costs.relative()[10] == pytest.approx(1.9)  # one width seen: the chord
    taught(costs, 9, 0.1 + 8 * 0.002)  # the steps: 0.002 s a token
    assert costs.relative()[[5, 17, 40]] == pytest.approx([1.08, 1.32, 1.78])  # their line's 0.002, between and beyond
    costs.observe_prefill(1, 21, 0.1 + 20 * 0.001)  # a later prefill, less loaded: the chord's 0.001 a token
    assert costs.relative()[17] == pytest.approx(1.24)  # the least of the two
    seeded = StepCosts(SECONDS)
    taught(seeded, 1, SECONDS[0])
    taught(seeded, 17, SECONDS[0] + 16 * 0.002)
    assert seeded.relative()[40] == pytest.approx((0.132 + 0.48 - 0.25) / 0.10)  # a calibration's prior (0.25 s at 17, 0.48 at 40): kept


def test_the_chord_adds_the_output_layer_that_the_prefill_did_not_score():
    costs = StepCosts(head_ratio=2.0)  # scoring a token costs twice the rest of its forward
    costs.observe_prefill(1, 201, 2.1)  # the prompt's 201 tokens in 2.1 s, its last one scored
    taught(costs, 1, 0.1)
    assert costs.relative()[[1, 2, 11]] == pytest.approx([1.0, 1.3, 4.0])  # 0.01 s a token, three times over
    with pytest.raises(ValueError, match="head_ratio"):
        StepCosts(head_ratio=-1.0)


def test_the_batch_line_adds_the_output_layer_too():
    costs = LoopCosts(head_ratio=1.0)
    costs.observe_prefill(4, 100, 0.1 + 0.0005 * 400 + 0.0005 * 4)  # 0.5 ms a token, 0.5 ms more a scored one (a row's last)
    costs.observe(4, 1, 2.0)  # a warm-up
    costs.observe(4, 1, 0.1 + 0.001 * 4)  # a plain step scores its 4 tokens: F = 0.1 s
    assert costs.at(4).fixed_cost_tokens == pytest.approx(100.0, rel=0.01)


def test_head_ratio_weighs_the_output_layer_against_the_layers_between():
    from transformers import LlamaConfig, LlamaForCausalLM

    from lookahead.integrations.hf import head_ratio

    config = dict(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    for tied in (False, True):
        model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=tied, **config))
        body = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name and "lm_head" not in name)
        assert head_ratio(model) == pytest.approx(1000 * 32 / body), tied


def test_a_calibrated_curve_ignores_the_prefill():
    costs = StepCosts(SECONDS)
    costs.observe_prefill(1, 201, 100.0)
    assert costs.relative()[[1, 2, 4, 8, 16, 32, 64]] == pytest.approx(SECONDS / 0.10)


def test_the_batch_line_starts_from_the_batched_prefill_and_first_plain_step():
    costs = LoopCosts()
    assert static_batch_draft_sizes([0.99] * 4, [8] * 4, [64] * 4, [1.0] * 4, cost=costs.at(4)) == [0] * 4  # unpriced
    costs.observe_prefill(4, 100, 0.1 + 0.001 * 400)  # F = 0.1 s, p = 1 ms per token
    costs.observe(4, 1, 2.0)  # the first plain step: one-time costs, not learnt from
    assert costs.line is None
    costs.observe(4, 1, 0.1 + 0.001 * 4)
    assert costs.at(4).fixed_cost_tokens == pytest.approx(100.0, rel=0.01)
    assert min(static_batch_draft_sizes([0.9] * 4, [8] * 4, [64] * 4, [1.0] * 4, cost=costs.at(4))) > 0  # priced: drafts pay


def test_trees_are_decided_by_the_tree_steps_measured_against_the_chain_curve():
    cheap, dear, busy, promising = LoopCosts(SECONDS), LoopCosts(SECONDS), LoopCosts(SECONDS), LoopCosts(SECONDS)
    for costs in (cheap, dear, busy, promising):
        for step in range(LoopCosts.CHAIN_SAMPLES + 1):  # first a chain step's host work (the first step is a warm-up)
            assert not costs.tree_trial() and costs.trees() is None
            costs.observe(1, 4, SECONDS[2], host=0.01 if step else 1.0)
        assert costs.tree_trial()
    for step in range(LoopCosts.TREE_SAMPLES + 1):  # the first tree step is a warm-up
        assert cheap.trees() is None and dear.trees() is None and busy.trees() is None
        cheap.observe(1, 16, 0.24 * 1.02, tree=True, host=0.01)  # the calibrated chain of width 16 takes 0.24 s
        dear.observe(1, 16, 0.24 * 1.30, tree=True, host=0.01, gain=1.5)  # a promise covers no more than TREE_MAX_PROMISED
        busy.observe(1, 16, 0.24, tree=True, host=0.01 + 0.25 * 0.08, gain=1.05)  # the forward a chain's, the host's work dearer
        promising.observe(1, 16, 0.24 * 1.08, tree=True, host=0.01, gain=1.07 + 0.1 * (step % 2))  # its trees promise more
    assert cheap.trees() is True and dear.trees() is False and busy.trees() is False and promising.trees() is True
    assert promising.tree_gain == pytest.approx(1.17) and busy.tree_gain == pytest.approx(1.05)  # the steps' median (the first not counted)
    assert dear.tree_gain == pytest.approx(1.5) and dear.tree_ratio() > LoopCosts.TREE_MAX_PROMISED
    assert cheap.tree_ratio() == pytest.approx((0.24 * 1.02 + 0.01) / 0.25) and busy.tree_ratio() == pytest.approx(1.08)
    assert LoopCosts(SECONDS, tree_over_chain=1.2).trees() is False  # a calibration's ratio decides at once
    before = cheap.curve.seconds_at(48)
    for _ in range(5):  # decided for trees: tree steps teach the curve their width as they cost, the host's work over a chain's included
        cheap.observe(1, 48, 2 * before, tree=True, host=0.01 + 0.003)
    assert cheap.curve.seen[48] and cheap.curve.seconds[48] == pytest.approx(2 * before + 0.003)  # not over the trial's ratio
    dear.observe(1, 48, 1.3 * 2 * before, tree=True)  # decided against trees: its tree steps teach nothing
    assert not dear.curve.seen[48] and dear.curve.seconds_at(48) == pytest.approx(before)


def test_costs_persist_across_calls_per_model_and_a_calibration_reseeds_them(monkeypatch):
    monkeypatch.setattr(calibration, "CALIBRATED", {})
    monkeypatch.setattr(calibration, "LEARNT", {})
    model = tiny_model("llama")
    learnt = calibration.loop_costs(model)
    assert learnt.curve.seed is None and learnt.tree_ratio() is None  # nothing timed up front
    assert calibration.loop_costs(model) is learnt and step_costs(model) is step_costs(model)
    verify_costs(model)
    seeded = calibration.loop_costs(model)
    assert seeded is not learnt and seeded.curve.seed is not None and seeded.tree_ratio() is not None
    assert step_costs(model).seed is not None


def test_a_first_call_learns_its_prior_from_its_own_prefill_and_steps(monkeypatch):
    import lookahead
    from lookahead.integrations import generate as generate_module

    monkeypatch.setattr(calibration, "LEARNT", {})
    monkeypatch.setattr(calibration, "CALIBRATED", {})
    model = tiny_model("llama")
    prompt = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    expected = model.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(lookahead.generate(model, prompt, drafter=LookupDrafter(), max_new_tokens=12, do_sample=False), expected)
    costs = calibration.loop_costs(model)
    assert costs.curve.slope < np.inf and costs.curve.seen[1] and costs.curve.calibrated is not None
    assert calibration.CALIBRATED == {}  # no calibration ran
    assert torch.equal(model.generate(prompt, assistant_model=LookupDrafter(), max_new_tokens=12, do_sample=False), expected)
    assistant = step_costs(model)
    assert assistant.slope < np.inf and assistant.seen[1] and assistant.calibrated is not None
    assert generate_module.loop_costs is calibration.loop_costs


def test_a_width_not_stepped_at_for_max_age_steps_is_priced_again_as_unseen():
    costs = StepCosts(SECONDS)
    taught(costs, 1, 0.10)
    taught(costs, 16, 1.0)  # priced under a burst of load: 10x
    assert costs.relative()[16] == pytest.approx(10.0)
    for _ in range(StepCosts.MAX_AGE + 1):
        costs.observe(1, 1, 0.10)  # plain steps only: 16 is never stepped at again
    assert not costs.seen[16] and costs.relative()[16] == pytest.approx(SECONDS[4] / 0.10)  # the calibration's price again


def test_a_plain_step_is_priced_at_most_a_blocks_over_least_block():
    costs = StepCosts(SECONDS)
    taught(costs, 1, 1.0)  # every plain step stalled: 10x
    taught(costs, 8, 0.16)  # and drafting steps never time a plain step again
    assert costs.seconds[1] == pytest.approx(0.16 / StepCosts.LEAST_BLOCK)
    assert costs.relative()[8] == pytest.approx(StepCosts.LEAST_BLOCK)  # not 0.16: a draft never kept is not free


def test_a_sure_draft_probes_twice_the_width_its_sizer_would_take_where_that_width_is_unmeasured():
    costs = StepCosts()
    costs.observe_prefill(1, 11, 0.1 + 10 * 0.05)  # a loaded prefill: the chord prices each token at half a plain step
    taught(costs, 1, 0.1)
    best = best_chain(0.95, 64, costs.one_row(65), MIN_GAIN)  # the rule's cut under that chord
    assert 0 < best < 64 and not costs.measured(2 * best + 2)
    assert chain_size(0.95, 64, costs) == 2 * best + 1  # sure (>= SURE): the unmeasured width twice as wide is tried
    assert SURE > 0.85 and chain_size(0.85, 64, costs) == best_chain(0.85, 64, costs.one_row(65), MIN_GAIN)  # not sure: no probe
    taught(costs, 2 * best + 2, 0.1 + (2 * best + 1) * 0.001)  # the probed width turns out cheap
    assert chain_size(0.95, 64, costs) > 2 * best  # and is taken
