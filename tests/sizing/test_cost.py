"""What a verify step costs (lookahead.sizing.cost): step costs learnt per width from the steps' times, from a
calibration or from the prefill's chord, a batch's line, trees decided by their measured steps; bad curves refused.
"""

import numpy as np
import pytest

from lookahead.sizing.cost import LEAST_BLOCK, ONCE_DEAREST, UNPRICED, CostCurve, LineCost, LoopCosts, StepCosts, cost_curve
from lookahead.sizing.rules import chain_size, static_batch_draft_sizes, tree_size
from tests.engine.test_slots import LINEAR, KeepRate, size


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


@pytest.mark.parametrize("points", [[1, 2, 3], [2, 2, 2, 2, 2, 2, 2], [1, 1, float("nan"), 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, -1]])
def test_bad_cost_curves_are_refused(points):
    with pytest.raises(ValueError, match="cost curve"):
        cost_curve(points)


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


def test_widths_past_64_never_cost_less_than_least_block():
    """A measured 64-token block far cheaper than a 63-token one (a stall at 63) extrapolates the widths past 64
    down its last segment, but never below LEAST_BLOCK plain steps: a 64-node tree reads width 65, and a cost
    that fell to 0 divided by zero (tree_size)."""
    costs = StepCosts(SECONDS)
    for width, seconds in ((1, 0.1), (63, 0.5), (64, 0.1)):
        for _ in range(StepCosts.MEASURED + 1):
            costs.observe(1, width, seconds)
    priced = costs.one_row(128)
    assert priced[63] > priced[64] and (priced[65:] >= LEAST_BLOCK).all() and priced[128] == LEAST_BLOCK
    assert 0 <= tree_size(np.full(64, 0.5), costs) <= 64
    falling = CostCurve(cost_curve([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.4]))  # a fixed curve whose last segment falls
    assert falling.one_row(400)[400] == LEAST_BLOCK


@pytest.mark.parametrize("seed", range(4))
def test_a_step_that_changes_no_price_keeps_the_curve_priced_as_pricing_afresh_would(seed):
    """observe reprices (price_widths) only where what pricing reads changed: after every step the curve is the one
    priced from scratch, through stalls, widths first seen, forgotten ones and the chord's prefills."""
    rng = np.random.default_rng(seed)
    costs = StepCosts(None if seed % 2 else SECONDS)
    costs.observe_prefill(1, 200, 0.02)
    for _ in range(300):
        width = int(rng.choice([1, 1, 1, 2, 5, 17, 33, 64, int(rng.integers(1, 66))]))
        costs.observe(1, width, float(rng.uniform(0.001, 0.0012) * (1 + 0.02 * width) * (4 if rng.random() < 0.05 else 1)))
        if rng.random() < 0.05:
            costs.observe_prefill(1, int(rng.integers(50, 300)), float(rng.uniform(0.005, 0.03)))
        kept = costs.one_row(64).copy()
        costs._priced, costs._fixed = None, None  # priced from scratch
        assert np.array_equal(kept, costs.one_row(64))
    assert costs.calibrated is not None
