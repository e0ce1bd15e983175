"""Draft sizing's rules (lookahead.sizing.rules): a chain's size, a tree's nodes, size and gain, a static batch's
sizes against trying every width, the batch sizer's kernel against a greedy reference, and the one-row sizer
on recorded outcomes against the best fixed draft length in hindsight.
"""

import itertools

import numpy as np
import pytest

from lookahead import LookupDrafter
from lookahead.bench import replay
from lookahead.sizing.cost import CostCurve, LineCost, StepCosts
from lookahead.sizing.rules import MAX_CHANCE, MIN_GAIN, SURE, TREE_WORTH_TOLERANCE, batch_draft_sizes, batch_sizes, best_chain, chain_size, static_batch_draft_sizes, tree_gain, tree_nodes, tree_size
from tests.models import SHARED
from tests.reference import brute_static_sizes, greedy_batch_sizes
from tests.sizing.test_cost import taught


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


def test_chain_size_is_the_first_best_width():
    rng = np.random.default_rng(2)
    for _ in range(300):
        curve = CostCurve(np.concatenate([[1.0], np.maximum.accumulate(1 + rng.uniform(0, 0.3, 65).round(1))]))
        a, available = float(rng.uniform(0, 1)), int(rng.integers(0, 70))
        widths, capped = np.arange(1, available + 2), min(a, 0.999)
        worth = (1 - capped**widths) / (1 - capped) / curve.cost(1, widths)  # E(n) / cost(1, n + 1) over every n at once
        best = int(np.argmax(worth))  # argmax: the first of equals
        assert chain_size(a, available, curve) == (best if worth[best] > (1 + MIN_GAIN) * worth[0] else 0)  # beating a plain step by MIN_GAIN


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


@pytest.mark.parametrize("seed", range(16))
def test_batch_sizes_kernel_equals_a_greedy_reference(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 9, size=12)
    # per-token chances falling along each row: a first token's chance, then factors of 1 (equal chances) or less
    first = rng.choice([0.0, 0.2, 0.5, 0.9, 0.999, 1.0], size=(12, 1))
    chances = first * np.cumprod(np.where(np.arange(8) == 0, 1.0, rng.choice([1.0, 0.9, 0.5, 0.25], size=(12, 8))), axis=1)
    rows = [chances[r, : lengths[r]].tolist() for r in range(12)]
    sizes = np.zeros(12, dtype=np.int64)
    for fixed in (1.0, 4.0, 64.0, 4096.0):
        for trust in (1.0, 0.3, 0.7):  # every chance trusted that far: fewer tokens, each expected to keep that share
            taken, kept = batch_sizes(chances, lengths, 12, fixed, sizes, trust)
            assert sizes.tolist() == greedy_batch_sizes(rows, fixed, trust), (fixed, trust)
            assert taken == sizes.sum()
            assert kept == pytest.approx(trust * sum(min(chances[r, j], MAX_CHANCE) for r in range(12) for j in range(sizes[r])))
        assert batch_draft_sizes(rows, cost=LineCost(fixed)) == greedy_batch_sizes(rows, fixed)


def test_batch_draft_sizes_refuses_chances_that_rise():
    with pytest.raises(ValueError, match="not rising"):
        batch_draft_sizes([[0.5, 0.6]], cost=LineCost(4.0))
