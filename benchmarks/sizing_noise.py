"""The one-row sizer under a step clock we control (a design aid, no model): the scenarios of
tests/sizing/test_cost_noise.py over 10 seeds each, printed as notes/sizing-2026-12-07.md's table.

    python benchmarks/sizing_noise.py        # from the repository's root
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.sizing.test_cost_noise import CPU, GPU, NOISES, Clock, LookupDrafter, StepCosts, edited, never_kept, run, tokens_per_step  # noqa: E402

NAMES = ["quiet", "stalls", "many-stalls", "busy"]


def main() -> None:
    rng = np.random.default_rng(1)
    prompt, output = rng.integers(10, 500, 15), rng.integers(10, 500, 200)
    for price, name in ((CPU, "cpu"), (GPU, "gpu")):
        for noise, noise_name in zip(NOISES, NAMES):
            third = []
            for seed in range(10):
                clock, costs, drafter = Clock(*price, seed=seed, **noise), StepCosts(head_ratio=0.3), LookupDrafter()
                for _ in range(2):
                    run(prompt, output, drafter, costs, clock)
                third.append(tokens_per_step(output, run(prompt, output, drafter, costs, clock)))
            print(f"answer in memory, {name}, {noise_name}: third call tokens/step min {min(third):.1f} median {np.median(third):.1f}")
    for noise, noise_name in zip(NOISES, NAMES):
        late = []
        for seed in range(10):
            p, o = never_kept(seed)
            verified = run(p, o, LookupDrafter(memory=False), StepCosts(head_ratio=0.3), Clock(*CPU, seed=seed, **noise))
            late.append(np.mean(np.asarray(verified[20:]) > 0))
        print(f"never kept, cpu, {noise_name}: share of steps after the 20th that draft: max {max(late):.2f} mean {np.mean(late):.2f}")
    for noise, noise_name in zip(NOISES[1:], NAMES[1:]):
        ratios = []
        for seed in range(10):
            p, o = edited(seed)
            quiet = run(p, o, LookupDrafter(memory=False), StepCosts(head_ratio=0.3), Clock(*GPU, seed=seed))
            noisy = run(p, o, LookupDrafter(memory=False), StepCosts(head_ratio=0.3), Clock(*GPU, seed=seed, **noise))
            ratios.append(len(quiet) / len(noisy))
        print(f"code edit, gpu, {noise_name}: noiseless steps / noisy: the same on {sum(r == 1 for r in ratios)}/10, "
              f"mean {np.mean(ratios):.3f}, min {min(ratios):.2f}")


if __name__ == "__main__":
    main()
