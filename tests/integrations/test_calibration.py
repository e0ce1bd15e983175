"""The verify-cost calibration and the cost state kept per model (lookahead.integrations.calibration)."""

import numpy as np
import pytest
import torch

from lookahead import LookupDrafter, verify_costs
from lookahead.integrations import calibration
from lookahead.integrations.calibration import step_costs, tree_over_chain_16
from tests.models import tiny_model


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
