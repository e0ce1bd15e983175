"""What verifying n drafted tokens costs on a model: learnt from the calls' own steps, or calibrated ahead.

By default nothing is timed up front: a model's first call starts from the chord through its
own prefill and first plain step (lookahead.sizing.cost.StepCosts) and learns each width
from its steps, and later calls of the process go on from what earlier ones learnt (one
cost state per model shape, device and dtype, per loop). `verify_costs(model)` times the
widths ahead of time (a few seconds on a CPU) and seeds the next calls with them.
"""

import functools
import threading
import time

import numpy as np
import torch

from lookahead.draft import Draft
from lookahead.integrations.hf import cache_inputs, drop_cache_tail, head_ratio, keep_rollback, new_cache, supports_logits_to_keep
from lookahead.integrations.row_cache import RowCache
from lookahead.integrations.support import tree_support
from lookahead.integrations.verify import build_block, forward_block
from lookahead.sizing.cost import SIZES, LoopCosts, StepCosts, cost_curve

CALIBRATED: dict[tuple, dict] = {}  # calibrated step times per model shape, device and dtype
# Per (model key, loop): the cost state the calls of this process learnt (LoopCosts for our loop,
# StepCosts for the assistant_model= loop); calls on one model share it, threads included (a
# step's time taken while another thread steps is noise either way).
LEARNT: dict[tuple, object] = {}
_LEARNT_LOCK = threading.Lock()  # two threads' first calls on one model get one cost state, not one each


def verify_costs(model, *, context: int = 256, repeats: int = 3) -> np.ndarray:
    """cost[n] = time of a forward pass over n new tokens / time over 1, for n in 0..64 (cost[0] unused).

    Measured once per (model class, shape, device, dtype) after `context` cached tokens;
    linear between the timed sizes (lookahead.sizing.cost.cost_curve).
    Calling it seeds the model's next calls (both loops) with these costs, in place of what
    earlier calls learnt; without it, calls learn from their own steps.
    """
    seconds = _calibrate(model, context, repeats)["chain"]
    return cost_curve(seconds / seconds[0])


def model_key(model) -> tuple:
    """What decides a model's step costs: its class, shape, device and dtype."""
    text = model.config.get_text_config()
    return (type(model).__name__, text.hidden_size, text.num_hidden_layers, text.vocab_size, str(model.device), str(model.dtype))


def step_costs(model) -> StepCosts:
    """The `assistant_model=` loop's one-row cost curve for `model`: what this process's calls learnt,
    seeded by the calibration where one was made (verify_costs)."""
    key = (*model_key(model), "assistant")
    with _LEARNT_LOCK:
        if key not in LEARNT:
            calibrated = CALIBRATED.get(model_key(model))
            LEARNT[key] = StepCosts(calibrated["chain"] if calibrated is not None else None, head_ratio=prefill_head_ratio(model))
        return LEARNT[key]


def loop_costs(model) -> LoopCosts:
    """Our loop's costs for `model` (the curve for one row, the line for many, trees or chains): what
    this process's calls learnt, seeded by the calibration where one was made (verify_costs)."""
    key = (*model_key(model), "loop")
    with _LEARNT_LOCK:
        if key not in LEARNT:
            calibrated = CALIBRATED.get(model_key(model))
            LEARNT[key] = (LoopCosts(head_ratio=prefill_head_ratio(model)) if calibrated is None
                           else LoopCosts(calibrated["chain"], tree_over_chain=calibrated["tree_over_chain"]))
        return LEARNT[key]


def prefill_head_ratio(model) -> float:
    """The output layer's share that a prefill leaves out of its per-token time: it scores its last
    token only where the forward takes `logits_to_keep` (both loops' prefills do), every token elsewhere."""
    return head_ratio(model) if supports_logits_to_keep(model) else 0.0


def tree_over_chain_16(model) -> float:
    """Time of our loop's step over a 16-node tree (its block and explicit 4D mask built, the
    forward, the kept path gathered into the cache) over its step over a 16-token chain (the
    model's own causal mask, the cache cropped): what a tree step adds to a block of its width,
    the host's share included (nan for a family without trees)."""
    return _calibrate(model)["tree_over_chain"]


def timed_forward(model, run) -> float:
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _calibrate(model, context: int = 256, repeats: int = 3) -> dict:
    """{"chain": seconds per forward over SIZES new tokens; "chain16", "tree16": seconds of our
    loop's step over a 16-token chain and a 16-node tree (nan without trees); "tree_over_chain":
    their ratio}, after `context`
    cached tokens; measured once per model shape.

    Cost: (repeats + 1) forward passes over each of SIZES and the two steps (0.3-3 s for a
    0.5B model on a 2-core CPU)."""
    key = model_key(model)
    if key in CALIBRATED:
        return CALIBRATED[key]
    text = model.config.get_text_config()
    generator = torch.Generator().manual_seed(0)
    vocab = text.vocab_size
    prefix = torch.randint(0, vocab, (1, context), generator=generator)
    blocks = [torch.randint(0, vocab, (1, size), generator=generator).to(model.device) for size in SIZES]
    dtype = model.dtype if model.dtype.is_floating_point else torch.float32
    with torch.inference_mode():
        cache = new_cache(model)
        model(input_ids=prefix.to(model.device), **cache_inputs(model, cache))
        drop_cache_tail(cache, 0)  # a recording sliding-window layer cut back to its window, as after every step

        def forward(block):
            keep_rollback(cache, block.shape[1])  # the whole block is dropped again
            seconds = timed_forward(model, lambda: model(**cache_inputs(model, cache), input_ids=block))
            drop_cache_tail(cache, block.shape[1])
            return seconds

        runs = [functools.partial(forward, block) for block in blocks]
        if tree_support(model) is None:
            # The last cached token, then 16 nodes: a chain keeping 8 (a crop), or two branches of 8 keeping the second (a gather).
            nodes = torch.randint(0, vocab, (16,), generator=generator).numpy()
            chain = Draft.chain(nodes, 8)
            tree = Draft(nodes, np.array([-1, *range(7), -1, *range(8, 15)]), 8)
            context_ids = prefix[0].tolist()
            runs += [functools.partial(loop_step, model, cache, context_ids, chain, list(range(9)), dtype),
                     functools.partial(loop_step, model, cache, context_ids, tree, [0, *range(9, 17)], dtype)]
        # Rounds over every shape, the first to warm them up; each shape's fastest round counts.
        # Another process on the machine only ever adds time, and taking turns spreads it over
        # the shapes rather than onto one of them.
        samples = [[] for _ in runs]
        for _ in range(repeats + 1):
            for run, times in zip(runs, samples):
                times.append(run())
    fastest = [min(times[1:]) for times in samples]
    # A wider block streams the same weights as one token and computes more: never cheaper.
    chain = np.maximum(np.asarray(fastest[: len(SIZES)]), fastest[0])
    chain16, tree16 = fastest[len(SIZES) :] if len(runs) > len(SIZES) else (float("nan"), float("nan"))
    CALIBRATED[key] = {"chain": chain, "chain16": chain16, "tree16": tree16, "tree_over_chain": float(tree16 / chain16)}
    for loop in ("assistant", "loop"):
        LEARNT.pop((*key, loop), None)  # the next calls start from the calibration
    return CALIBRATED[key]


def loop_step(model, cache, context_ids: list[int], draft: Draft, kept: list[int], dtype) -> float:
    """Seconds of our loop's step over `draft` after the cached `context_ids` (one row), as
    lookahead.generate takes it: the block built, the forward, the choices read (the sync the
    walk makes), the `kept` block entries kept in the cache; the cache restored after."""
    rows = RowCache(cache, 1)
    rows.keep([0], [list(range(len(context_ids)))], len(context_ids))  # the cached context, no holes

    def step():
        block = build_block([context_ids], [draft], [0], rows, uncached=1, dtype=dtype)
        logits, _ = forward_block(model, block, rows, supports_logits_to_keep(model), model.device)
        logits[0].argmax(dim=-1).tolist()
        rows.keep([0], [kept], block.tokens.shape[1])

    seconds = timed_forward(model, step)
    drop_cache_tail(cache, len(kept))
    return seconds
