"""The load rule (lookahead.sizing.load: DraftStepCost, KeptShare, worth_sending), as LookupProposer applies it over a
fake runner: drafts shrink as rows grow and follow the measured acceptance, the step's cost is fitted from the time
between calls, each chance is trusted as far as the load's drafts kept it, and drafts stop where they do not pay.
"""

import random

import numpy as np
import pytest

from lookahead.integrations.vllm import LookupProposer
from lookahead.engine import kernels
from lookahead.sizing.load import DraftStepCost, KeptShare
import lookahead.integrations.vllm.proposer as proposer_module
from tests.fake_runner import A, B, C, FakeBatch, FakeRunner, fake_config


def busy_rows(n):
    return [(f"r{i}", [100 + i, 200 + i, 300 + i] * 4, [100 + i]) for i in range(n)], [[100 + i] for i in range(n)]


def test_load_rule_shrinks_drafts_as_rows_grow():
    def drafted(rows, fixed_cost_tokens):
        proposer = LookupProposer(fake_config(k=8, fixed_cost_tokens=fixed_cost_tokens))
        runner = FakeRunner(proposer)
        runner.input_batch = FakeBatch(max_rows=rows)
        return sum(map(len, runner.step(proposer, *busy_rows(rows))))

    # keep chance 0.5 before anything is learnt: per row 1, 0.5, 0.25, ... expected tokens
    assert drafted(1, 4096.0) == 8  # idle hardware: everything worth anything
    assert drafted(1, 8.0) / 1 > drafted(4, 8.0) / 4 > drafted(16, 8.0) / 16  # fewer per row as rows grow
    assert drafted(16, 1.0) == 0  # every token costs: drafting does not pay


def test_load_rule_follows_measured_acceptance():
    proposer = LookupProposer(fake_config(k=8, fixed_cost_tokens=8.0))
    runner = FakeRunner(proposer)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9] * 2
    output = [1]
    first = runner.step(proposer, [("a", prompt, output)], [[1]])[0]
    for _ in range(6):  # the model writes every drafted token: the keep chance rises, drafts grow
        accepted = first + [prompt[(len(output) + len(first)) % 9]]
        output = output + accepted
        first = runner.step(proposer, [("a", prompt, output)], [accepted])[0]
    long_draft = len(first)
    rng = random.Random(0)
    for _ in range(30):  # the model never writes the chain's first token: drafts shrink, then stop
        slot = proposer.batch.requests["a"]
        chain = proposer.batch.slots.plan_ids[slot, : proposer.batch.slots.cols[slot, kernels.PLAN_LEN]].tolist()  # the pending chain
        output = output + [rng.choice([t for t in range(1, 10) if chain[:1] != [t]])]
        first = runner.step(proposer, [("a", prompt, output)], [[output[-1]]])[0]
    assert long_draft >= 6 and first == []


def test_step_costs_measured_between_calls():
    proposer = LookupProposer(fake_config(k=4))
    runner = FakeRunner(proposer)
    assert isinstance(proposer.cost, DraftStepCost) and proposer.cost.samples == 0
    output = [5]
    for _ in range(3):  # the same request, one token a step: steps the fit can use
        runner.step(proposer, [("a", A, output)], [[output[-1]]])
        output = output + [9]
    assert proposer.cost.samples == 2
    runner.step(proposer, [("a", A, output), ("b", B, [20])], [[9], [20]])  # "b" joined: its prefill ran in the step
    assert proposer.cost.samples == 2
    assert not isinstance(LookupProposer(fake_config(fixed_cost_tokens=32)).cost, DraftStepCost)  # fixed: nothing measured


def test_a_step_after_a_prefill_chunk_is_measured_over_its_decode_rows():
    """The rows a step decoded are those with room for a chain, whether or not they drafted: once the row
    in a prefill chunk leaves (aborted), the next step ran exactly the decode rows and is measured."""
    proposer = LookupProposer(fake_config(k=4))
    runner = FakeRunner(proposer)
    plain, chunk = list(range(100, 112)), list(range(200, 212))  # "a" repeats nothing: it never drafts
    runner.step(proposer, [("a", plain, [1]), ("c", C, [40]), ("b", chunk, [])], [[1], [40], []])
    out = runner.step(proposer, [("a", plain, [1, 2]), ("c", C, [40, 41]), ("b", chunk, [])], [[2], [41], []])
    assert out[0] == [] and out[1] != [] and out[2] == []  # "c" drafted, "a" did not, "b" is still in its prefill
    samples = proposer.cost.samples
    runner.step(proposer, [("a", plain, [1, 2, 3]), ("c", C, [40, 41, 42])], [[3], [42]])  # "b" aborted
    assert proposer.cost.samples == samples + 1


def test_the_step_cost_fit_is_the_faded_penalised_least_squares_line():
    """DraftStepCost solves its 3x3 system by hand (load.solve3, no numpy on the per-step path): the same
    F/p and D/p as numpy's least squares over the faded steps and the prior's rows, on engine-like steps
    (1 to 576 tokens, 5 to 350 ms)."""
    rng = np.random.default_rng(0)
    fit = DraftStepCost(prior=64.0)
    xs, ys = [], []
    for _ in range(300):
        rows = int(rng.choice([1, 4, 16, 64]))
        tokens = rows + int(rng.integers(0, 8 * rows)) * int(rng.random() < 0.6)
        drafted = tokens > rows
        seconds = 0.004 + 0.0006 * tokens + 0.002 * drafted + rng.normal(0, 0.001)
        fit.observe(tokens, drafted, seconds)
        xs.append([1.0, tokens, float(drafted)])
        ys.append(seconds)
    weights = np.sqrt(fit.fade ** np.arange(len(xs))[::-1])
    values, vectors = np.linalg.eigh(np.array(fit._penalty))
    penalty = np.sqrt(np.clip(values, 0, None))[:, None] * vectors.T  # rows r with r^T r = the penalty
    a = np.vstack([np.array(xs) * weights[:, None], penalty])
    fixed, per_token, draft = np.linalg.lstsq(a, np.concatenate([np.array(ys) * weights, np.zeros(3)]), rcond=None)[0]
    assert fit.fixed_cost_tokens == pytest.approx(fixed / per_token, rel=1e-6)
    assert fit.draft_cost_tokens == pytest.approx(draft / per_token, rel=1e-6)
    assert 5 < fit.fixed_cost_tokens < 9 and 2 < fit.draft_cost_tokens < 5  # near the truth (F/p 6.7, D/p 3.3) after 300 steps


@pytest.mark.parametrize("fixed_cost_tokens", [None, 30.0])
def test_the_sizer_trusts_a_load_as_far_as_its_drafts_kept_what_it_expected(fixed_cost_tokens, monkeypatch):
    """Drafts of which the model keeps one token or none: the learnt rule's trust at one row falls
    from 1 toward that share of what the sizer expected, and the sizer is handed it every step; told
    the costs, nothing is learnt and the trust stays 1."""
    proposer = LookupProposer(fake_config(k=4, fixed_cost_tokens=fixed_cost_tokens))
    runner = FakeRunner(proposer)
    now = [0.0]
    proposer.clock = lambda: now[0]
    handed = []  # per sizing: the trust the sizer was handed
    sizes = proposer_module.batch_sizes
    # the periodic text's continuations all agree, so the chances are high: this text's failures belie them
    monkeypatch.setattr(proposer_module, "batch_sizes", lambda *a: handed.append(a[5]) or sizes(*a))
    period = [7, 8, 9, 10]
    prompt, output, sampled = period * 4, [7], [[7]]
    for step in range(60):
        draft = runner.step(proposer, [("a", prompt, output)], sampled)[0]
        own = period[(period.index(output[-1]) + 1) % 4] if output[-1] in period else 7  # the model's next token
        if draft and step % 2:  # every other draft keeps nothing: the model writes a token new to it
            sampled = [[1000 + step]]
        elif draft and draft[0] == own:  # the others keep their first token, never the second
            sampled = [[own, 1000 + step]]
        else:
            sampled = [[own]]
        output = output + sampled[0]
        now[0] += 0.01
    assert len(handed) >= 20
    if fixed_cost_tokens is None:
        assert handed[0] == 1.0 and handed[-1] < 0.9  # the prior, then what the drafts kept
        assert all(KeptShare.MIN_TRUST <= t <= 1.0 for t in handed) and proposer.kept_share.trust(1) == handed[-1]
    else:
        assert proposer.kept_share is None and set(handed) == {1.0}


@pytest.mark.parametrize("fixed_cost_tokens", [None, 30.0])
def test_load_rule_learns_that_drafting_does_not_pay_at_high_load(fixed_cost_tokens):
    """The engine's step times (F + p * tokens, D more when any draft is verified) teach the rule that
    at 32 rows drafting lowers tokens per second, while at one row it raises them: at 32 rows it sends
    nothing (but on the steps that measure drafting again), at one row it sends drafts. Told h = 30
    and nothing of D, it drafts at 32 rows on most steps."""
    rng = random.Random(0)
    proposer = LookupProposer(fake_config(k=4, max_model_len=4096, max_num_seqs=32, fixed_cost_tokens=fixed_cost_tokens))
    runner = FakeRunner(proposer)
    runner.input_batch = FakeBatch(max_rows=32, max_len=4096)
    now = [0.0]
    proposer.clock = lambda: now[0]
    # what each request writes: a period of 4 with one in seven of its tokens replaced by chance
    truth = {i: [(1000 * (1 + j % 4) + i) if rng.random() > 0.15 else 9000 + rng.randrange(4) for j in range(4000)]
             for i in range(32)}
    prompts = {i: [1000 + i, 2000 + i, 3000 + i, 4000 + i] * 3 for i in range(32)}
    outputs = {i: truth[i][:1] for i in range(32)}

    def steps(rows, count):
        sent = []
        drafts = {i: [] for i in rows}
        for _ in range(count):
            sampled = []
            for i in rows:
                done = len(outputs[i])
                kept = 0  # greedy verification: the drafted tokens that equal what the model writes, then its own
                while kept < len(drafts[i]) and drafts[i][kept] == truth[i][done + kept]:
                    kept += 1
                written = truth[i][done : done + kept + 1]
                outputs[i] += written
                sampled.append(written)
            out = runner.step(proposer, [(f"r{i}", prompts[i], outputs[i]) for i in rows], sampled)
            drafts = dict(zip(rows, out))
            tokens = sum(map(len, out)) + len(rows)
            now[0] += 0.030 + 0.001 * tokens + 0.025 * any(out)  # the engine's step: F = 30 ms, p = 1 ms, D = 25 ms
            sent.append(sum(map(len, out)))
        return sent

    many, one = list(range(32)), [0]
    for _ in range(3):
        steps(many, 40)
        steps(one, 20)
    high, low = steps(many, 40), steps(one, 10)
    assert sum(map(bool, low)) >= 8  # one row: drafts pay (not a chain anchored on a replaced token: few occurrences back it)
    if fixed_cost_tokens is None:  # learnt: D makes drafting a loss at 32 rows
        assert proposer.cost.fixed_cost_tokens == pytest.approx(30, rel=0.1)
        assert proposer.cost.draft_cost_tokens == pytest.approx(25, rel=0.1)
        assert sum(map(bool, high)) < 40 / 3 and proposer.stats.withheld_steps > 0
    else:  # told h = 30 and nothing of D: it drafts at 32 rows on most steps (not on those, the first few after
        # the one-row phase among them, whose drafts are expected to gain under load.MIN_GAIN)
        assert sum(map(bool, high)) > 0.75 * 40
