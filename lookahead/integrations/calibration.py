"""`verify_costs`: what verifying n drafted tokens costs on a model, measured once per shape, device and dtype."""

import time

import numpy as np
import torch

from lookahead.integrations.transformers import drop_cache_tail, new_cache
from lookahead.sizing import SIZES, cost_curve

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
        generator = torch.Generator().manual_seed(0)
        vocab = config.get_text_config().vocab_size
        prefix = torch.randint(0, vocab, (1, context), generator=generator).to(model.device)
        times = []
        with torch.inference_mode():
            cache = new_cache(model)
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
                    drop_cache_tail(cache, size)
                times.append(float(np.median(samples[1:])))
        measured = np.asarray(times) / times[0]
        _COSTS[key] = cost_curve(np.maximum.accumulate(measured))
    return _COSTS[key]
