"""The one-row sizer under a step clock we control: heavy-tailed noise must not change what it drafts.

A fake loop (`run`) drives a Request as the loops do (plan, verify against a known output, observe the
step's seconds) with seconds from `Clock`: fixed + per_token * width, times noise, with stalls (a step
10x to 100x slower now and then) or a load that comes and goes. Deterministic (seeded), no model, fast.
"""

import numpy as np
import pytest

from lookahead import LookupDrafter
from lookahead.request import Request
from lookahead.sizing.cost import StepCosts


class Clock:
    """A step's seconds over `width` tokens: (fixed + per_token * width) times noise.

    `stall`: the chance that a step stalls, taking 1 + 10 * Pareto(1.5) times as long (heavy-tailed);
    `busy`: a load that comes and goes (each step a 5% chance to switch between quiet and 3x-30x slower)."""

    def __init__(self, fixed, per_token, *, stall=0.0, busy=False, seed=0):
        self.fixed, self.per_token, self.stall, self.busy = fixed, per_token, stall, busy
        self.rng = np.random.default_rng(seed)
        self.load = 1.0

    def __call__(self, width: int) -> float:
        seconds = (self.fixed + self.per_token * width) * np.exp(self.rng.normal(0, 0.03))
        if self.busy:
            if self.rng.random() < 0.05:
                self.load = 1.0 if self.load > 1 else float(np.exp(self.rng.uniform(np.log(3), np.log(30))))
            seconds *= self.load * np.exp(self.rng.normal(0, 0.3))
        if self.rng.random() < self.stall:
            seconds *= 1 + 10 * self.rng.pareto(1.5)
        return seconds


def run(prompt, output, drafter, costs, clock, room: int = 64) -> list[int]:
    """One request as the `assistant_model=` loop runs it (its first step also prefills the prompt); returns the
    drafted tokens each step verified."""
    request = Request(drafter, sized=True)
    request.start(prompt)
    position, verified = 0, []
    while position < len(output):
        draft = request.plan(min(room, len(output) - position - 1), costs).draft.token_ids
        kept = 0
        while kept < len(draft) and draft[kept] == output[position + kept]:
            kept += 1
        width = 1 + len(draft)
        if not verified:
            costs.observe_prefill(1, len(prompt) + width, clock(len(prompt) + width))
        else:
            costs.observe(1, width, clock(width))
        request.verified(output[position : position + kept + 1])
        position += kept + 1
        verified.append(len(draft))
    request.finish()
    return verified


def tokens_per_step(output, verified) -> float:
    return len(output) / len(verified)


CPU = (1e-3, 1e-4)  # a plain step 1.1 ms, each verified token 0.1 ms more
GPU = (20e-3, 1e-4)  # 20 ms + 0.1 ms a token
NOISES = [dict(), dict(stall=0.1), dict(stall=0.3), dict(busy=True)]


@pytest.mark.parametrize("noise", NOISES, ids=["quiet", "stalls", "many-stalls", "busy"])
@pytest.mark.parametrize("price", [CPU, GPU], ids=["cpu", "gpu"])
def test_drafts_that_are_kept_are_taken_under_noise(price, noise):
    rng = np.random.default_rng(1)
    prompt, output = rng.integers(10, 500, 15), rng.integers(10, 500, 200)
    for seed in range(5):
        clock, costs, drafter = Clock(*price, seed=seed, **noise), StepCosts(head_ratio=0.3), LookupDrafter()
        run(prompt, output, drafter, costs, clock)  # the answer goes into memory: every later draft is kept
        run(prompt, output, drafter, costs, clock)
        verified = run(prompt, output, drafter, costs, clock)
        assert tokens_per_step(output, verified) >= 10, (seed, verified)
        assert sum(n == 0 for n in verified[1:-1]) <= 1, (seed, verified)  # drafts on every step but a few


def never_kept(seed: int, vocab: int = 20, length: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """A prompt whose token t is always followed by t + 1, and an output over the same tokens in which no pair of
    neighbours repeats, nor follows the prompt's: every draft, from the prompt or the output, is wrong."""
    rng = np.random.default_rng(seed)
    prompt = np.tile(np.arange(vocab), 10) + 10
    used, output = set(), [int(rng.integers(vocab))]
    while len(output) < length:
        options = [t for t in range(vocab) if t != (output[-1] + 1) % vocab and (output[-1], t) not in used]
        output.append(int(rng.choice(options)))
        used.add((output[-2], output[-1]))
    return prompt, np.asarray(output) + 10


@pytest.mark.parametrize("noise", NOISES, ids=["quiet", "stalls", "many-stalls", "busy"])
def test_drafts_never_kept_stop_within_a_few_steps(noise):
    for seed in range(5):
        prompt, output = never_kept(seed)
        drafter = LookupDrafter(memory=False)
        drafter.reset(prompt)
        assert len(drafter.propose())  # drafts are there
        verified = run(prompt, output, drafter, StepCosts(head_ratio=0.3), Clock(*CPU, seed=seed, **noise))
        assert np.mean(np.asarray(verified[20:]) > 0) <= 0.1, (seed, verified)


def edited(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A code edit: the output copies the prompt with a changed token now and then."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(10, 5000, 300)
    output = prompt[:240].copy()
    changed = rng.random(240) < 0.06
    output[changed] = rng.integers(5000, 6000, int(changed.sum()))
    return prompt, output


@pytest.mark.parametrize("noise", NOISES[1:], ids=["stalls", "many-stalls", "busy"])
def test_at_a_gpus_prices_noise_changes_few_decisions(noise):
    ratios = []  # noiseless steps over noisy ones, per output
    for seed in range(10):
        prompt, output = edited(seed)
        quiet = run(prompt, output, LookupDrafter(memory=False), StepCosts(head_ratio=0.3), Clock(*GPU, seed=seed))
        noisy = run(prompt, output, LookupDrafter(memory=False), StepCosts(head_ratio=0.3), Clock(*GPU, seed=seed, **noise))
        ratios.append(len(quiet) / len(noisy))
    assert sum(r == 1.0 for r in ratios) >= 6, ratios  # as many steps as without noise on most outputs
    assert np.mean(ratios) >= 0.95 and min(ratios) >= 0.8, ratios
