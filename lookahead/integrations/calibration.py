"""`verify_costs`: what verifying n drafted tokens costs on a model, measured once per shape, device and dtype."""

import time

import numpy as np
import torch

from lookahead.integrations.hf import cache_inputs, drop_cache_tail, new_cache
from lookahead.integrations.support import tree_support
from lookahead.sizing.cost import SIZES, LoopCosts, StepCosts, cost_curve

CALIBRATED: dict[tuple, dict] = {}  # calibrated step times per model shape, device and dtype


def verify_costs(model, *, context: int = 256, repeats: int = 3) -> np.ndarray:
    """cost[n] = time of a forward pass over n new tokens / time over 1, for n in 0..64 (cost[0] unused).

    Measured once per (model class, shape, device, dtype) after `context` cached tokens;
    linear between the timed sizes (lookahead.sizing.cost.cost_curve).
    """
    seconds = _calibrate(model, context, repeats)["chain"]
    return cost_curve(seconds / seconds[0])


def step_costs(model) -> StepCosts:
    """A fresh one-row cost curve for one request, seeded with the model's calibrated step times."""
    return StepCosts(_calibrate(model)["chain"])


def loop_costs(model) -> LoopCosts:
    """Fresh costs for one call of our loop (the curve for one row, the line for many), seeded by the calibration."""
    return LoopCosts(_calibrate(model)["chain"])


def tree_over_chain_16(model) -> float:
    """Time of a forward pass over a 16-node tree (explicit 4D mask, as our loop verifies
    trees) over a 16-token chain's (the model's own causal mask): what the tree's mask path
    adds to a block of its width (nan for a family without trees)."""
    times = _calibrate(model)
    return float(times["tree16"] / times["chain"][SIZES.index(16)])


def timed_forward(model, run) -> float:
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _calibrate(model, context: int = 256, repeats: int = 3) -> dict:
    """{"chain": seconds per forward over SIZES new tokens, "tree16": seconds over a 16-node
    tree with an explicit mask}, after `context` cached tokens; measured once per model shape.

    Cost: (repeats + 1) forward passes over each of SIZES and the tree (0.3-3 s for a 0.5B
    model on a 2-core CPU)."""
    config = model.config
    text = config.get_text_config()
    key = (type(model).__name__, text.hidden_size, text.num_hidden_layers, text.vocab_size, str(model.device), str(model.dtype))
    if key in CALIBRATED:
        return CALIBRATED[key]
    generator = torch.Generator().manual_seed(0)
    vocab = text.vocab_size
    prefix = torch.randint(0, vocab, (1, context), generator=generator).to(model.device)
    # A block of each shape, and a 16-node tree: two branches of 8 under the last cached token.
    blocks = [torch.randint(0, vocab, (1, size), generator=generator).to(model.device) for size in SIZES]
    dtype = model.dtype if model.dtype.is_floating_point else torch.float32
    visible = torch.ones(16, 16, dtype=torch.bool).tril_()
    visible[8:, :8] = False
    mask = torch.zeros((1, 1, 16, context + 16), dtype=dtype, device=model.device)
    mask[0, 0, :, context:].masked_fill_(~visible.to(model.device), torch.finfo(dtype).min)
    positions = torch.tensor([[context + (i % 8) for i in range(16)]], device=model.device)
    tree = dict(input_ids=blocks[SIZES.index(16)], attention_mask=mask, position_ids=positions)
    shapes = [dict(input_ids=block) for block in blocks] + ([tree] if tree_support(model) is None else [])  # tree16: nan without trees
    samples = [[] for _ in shapes]
    with torch.inference_mode():
        cache = new_cache(model)
        model(input_ids=prefix, **cache_inputs(model, cache))
        drop_cache_tail(cache, 0)  # a recording sliding-window layer cut back to its window, as after every step
        # Rounds over every shape, the first to warm them up; each shape's fastest round counts.
        # Another process on the machine only ever adds time, and taking turns spreads it over
        # the shapes rather than onto one of them.
        for _ in range(repeats + 1):
            for shape, times in zip(shapes, samples):
                width = shape["input_ids"].shape[1]
                times.append(timed_forward(model, lambda: model(**cache_inputs(model, cache), **shape)))
                drop_cache_tail(cache, width)
    fastest = [min(times[1:]) for times in samples]
    # A wider block streams the same weights as one token and computes more: never cheaper.
    chain = np.maximum(np.asarray(fastest[: len(SIZES)]), fastest[0])
    tree16 = max(fastest[-1], fastest[0]) if len(shapes) > len(SIZES) else float("nan")
    CALIBRATED[key] = {"chain": chain, "tree16": tree16}
    return CALIBRATED[key]
