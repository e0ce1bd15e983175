"""Cost-aware draft sizing: what verifying n tokens costs here, and how many are worth drafting.

`verify_costs(model)` times forward passes of 1..64 new tokens once per model shape,
device and dtype (cached for the process). `DraftSizer` keeps, per anchor match length, a
running estimate of the chance that a drafted token is kept, and cuts each chain draft to
the length n that maximises expected tokens per unit of time:

    E(n) = sum_{k=0..n} a^k = (1 - a^(n+1)) / (1 - a)        (a: per-token keep chance)
    n*   = argmax_n E(n) / cost(n + 1)                        (n = 0: a plain step)

so where drafts keep failing, and wide blocks are dear, it stops drafting.
"""

import time

import numpy as np
import torch

SIZES = (1, 2, 4, 8, 16, 32, 64)
_COSTS: dict[tuple, np.ndarray] = {}


def verify_costs(model, *, context: int = 256, repeats: int = 3) -> np.ndarray:
    """cost[n] = time of a forward pass over n new tokens / time over 1, for n in 0..64 (cost[0] unused).

    Measured once per (model class, shape, device, dtype) after `context` cached tokens;
    linear between the timed sizes.
    """
    config = model.config
    key = (type(model).__name__, config.get_text_config().hidden_size, config.get_text_config().num_hidden_layers,
           config.get_text_config().vocab_size, str(model.device), str(model.dtype))
    if key not in _COSTS:
        from transformers import DynamicCache

        generator = torch.Generator().manual_seed(0)
        vocab = config.get_text_config().vocab_size
        prefix = torch.randint(0, vocab, (1, context), generator=generator).to(model.device)
        times = []
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            model(input_ids=prefix, cache=cache, use_cache=True)
            for size in SIZES:
                block = torch.randint(0, vocab, (1, size), generator=generator).to(model.device)
                samples = []
                for _ in range(repeats + 1):  # the first run of a shape warms it up
                    if model.device.type == "cuda":
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    model(input_ids=block, cache=cache, use_cache=True)
                    if model.device.type == "cuda":
                        torch.cuda.synchronize()
                    samples.append(time.perf_counter() - start)
                    cache.crop(-size)
                times.append(float(np.median(samples[1:])))
        measured = np.asarray(times) / times[0]
        _COSTS[key] = np.interp(np.arange(SIZES[-1] + 1), SIZES, np.maximum.accumulate(measured))
    return _COSTS[key]


class DraftSizer:
    """Per-request choice of how many drafted tokens to verify.

    The per-token keep chance is estimated per anchor match length from counts of kept
    tokens and failures (a failure: the first drafted token the model did not write),
    with old counts fading. Verified tokens count at once; the unverified rest of a cut
    draft counts once the model's output shows how far it would have gone, so drafts
    keep teaching the estimate while few or none of their tokens are verified.

    Args:
        costs: verify_costs(model).
        max_ngram: the drafter's longest anchor.
        fade: factor applied to old counts at each update.
    """

    def __init__(self, costs: np.ndarray, max_ngram: int, *, fade: float = 0.9):
        self.costs = costs
        self.kept = np.ones(max_ngram + 1)  # per anchor length: faded count of kept tokens (prior 1)
        self.failed = np.ones(max_ngram + 1)  # and of failures (prior 1): a starts at 0.5
        self.fade = fade
        self._watched: list[tuple[int, list[int], int]] = []  # (match_len, unverified draft ids, position)

    def keep_chance(self, match_len: int) -> float:
        m = min(match_len, self.kept.shape[0] - 1)
        return float(self.kept[m] / (self.kept[m] + self.failed[m]))

    def size(self, match_len: int, available: int) -> int:
        """How many of `available` drafted tokens (anchored on match_len) to verify."""
        a = min(self.keep_chance(match_len), 0.999)
        n = np.arange(min(available, self.costs.shape[0] - 2) + 1)
        expected = (1 - a ** (n + 1)) / (1 - a)
        return int(np.argmax(expected / self.costs[n + 1]))

    def update(self, match_len: int, kept: int, failed: bool) -> None:
        m = min(match_len, self.kept.shape[0] - 1)
        self.kept[m] = self.fade * self.kept[m] + kept
        self.failed[m] = self.fade * self.failed[m] + failed

    def verified(self, match_len: int, draft_ids: list[int], verified: int, kept: int, position: int) -> None:
        """Learns from a step that verified the first `verified` of `draft_ids` (drafted at
        sequence[position:]) and kept `kept` of them; watches the unverified rest."""
        if verified:
            self.update(match_len, kept, kept < verified)
        if kept == verified and verified < len(draft_ids):
            self._watched.append((match_len, draft_ids[verified:], position + verified))

    def settle(self, sequence: list[int]) -> None:
        """Scores each watched rest as soon as the sequence shows where it fails or ends."""
        still = []
        for match_len, ids, position in self._watched:
            written = sequence[position : position + len(ids)]
            agree = 0
            while agree < len(written) and written[agree] == ids[agree]:
                agree += 1
            if agree < len(written) or len(written) == len(ids):
                self.update(match_len, agree, agree < len(ids))
            else:
                still.append((match_len, ids, position))
        self._watched = still
