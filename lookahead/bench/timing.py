"""One timed generate() call, for every bench mode: wall clock, time to first token, forward passes.

Time to first token (TTFT) is the end of the target's first forward pass (the prefill; in the
assisted loops it also verifies the first draft), time per output token (TPOT) the rest of the
call over the tokens after the first: TTFT + TPOT * (new tokens - 1) == wall clock.
"""

import contextlib
import subprocess
import sys
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    seconds: float  # the whole generate() call, the device synchronised either side
    first_token_s: float  # from the call's start to the end of the first forward pass
    forwards: int  # forward passes of the target
    forward_s: float | None  # summed seconds inside them (each synchronised on CUDA), with forward_time=True


def decode_seconds_per_token(seconds: float, first_token_s: float, new_tokens: int) -> float | None:
    """TPOT: (wall - TTFT) / (new tokens - 1); None with a single token (nothing after the first)."""
    return (seconds - first_token_s) / (new_tokens - 1) if new_tokens > 1 else None


def timed_generate(model, input_ids: torch.Tensor, kwargs: dict, *, forward_time: bool = False) -> tuple[torch.Tensor, Timing]:
    """model.generate(input_ids, **kwargs) under a clock on the target's forward passes.

    On CUDA the first forward's end is synchronised once (generate syncs there anyway to read
    its first token); with forward_time every forward is synchronised on entry and exit, which
    stalls the pipeline: only for the loop-overhead mode, never beside a wall-clock ratio.
    """
    cuda = model.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    clock = dict(forwards=0, first=None, inside=0.0, entered=0.0)

    def before(*_):
        if forward_time:
            sync()
            clock["entered"] = time.perf_counter()

    def after(*_):
        clock["forwards"] += 1
        if forward_time or clock["first"] is None:
            sync()
            now = time.perf_counter()
            clock["first"] = now if clock["first"] is None else clock["first"]
            clock["inside"] += now - clock["entered"] if forward_time else 0.0

    # The clock's entry runs before, its exit after, any other hook (the forcing's lift is model work).
    handles = [model.register_forward_pre_hook(before, prepend=True), model.register_forward_hook(after)]
    try:
        sync()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids, **kwargs)
        sync()
        seconds = time.perf_counter() - start
    finally:
        for handle in handles:
            handle.remove()
    first = seconds if clock["first"] is None else clock["first"] - start
    return out, Timing(seconds, first, clock["forwards"], clock["inside"] if forward_time else None)


@contextlib.contextmanager
def busy_load(processes: int):
    """`processes` other jobs, each holding a core (a Python busy loop), for the length of the block: a busy
    machine, under which every method (plain greedy included) is timed alike as they take turns."""
    jobs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for job in jobs:
            job.kill()
            job.wait()
