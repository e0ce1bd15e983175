"""What a one-row step of `lookahead.generate` costs outside the forward with and without drafting: the
loop-overhead bench's model and requests (lookahead.bench.loop_overhead), methods taking turns on each request:

- greedy: transformers' own loop;
- our loop, no drafts: `lookahead.generate` with the request's planning and bookkeeping stubbed out (every
  step plain: block, forward, walk, cache, costs observed), the floor a drafting step adds to;
- our chains: `lookahead.generate(tree=False)`, sized as by default.

Their difference is what drafting itself costs a step (search, sizing, stats, the index kept), the budget
item 4 of the engine-everywhere issue sets: a chain step at most 1.2x greedy's outside time. Needs ../shared
beside the repository:

    OMP_NUM_THREADS=1 python benchmarks/loop_floor.py [--requests 3] [--repeats 2]
"""

import argparse
import functools
from pathlib import Path
from unittest import mock

import torch

import lookahead
from lookahead import LookupDrafter
from lookahead.bench.e2e import bench_model, select_methods
from lookahead.bench.loop_overhead import OVERHEAD_SHAPE, compact_vocabulary, overhead_summary
from lookahead.bench.tables import format_table
from lookahead.bench.traces import build_model, forced_trace_task, read_traces
from lookahead.draft import EMPTY_DRAFT, StepPlan
from lookahead.request import Request

TRACES = [Path(__file__).resolve().parents[2] / "shared" / "traces" / f"{name}.dev.jsonl" for name in ("cnn", "instructcoder", "sharegpt")]
FLOOR = "our loop, no drafts"
CHAINS = "lookahead.generate chain"


@functools.wraps(lookahead.generate)  # (its signature: transformers passes custom_generate the options it names)
def undrafted(*args, **kwargs):
    """lookahead.generate with every step plain and nothing planned, learnt or recorded for it."""
    with mock.patch.object(Request, "plan", lambda self, room, cost=None, **options: StepPlan(EMPTY_DRAFT, EMPTY_DRAFT, 0)), \
            mock.patch.object(Request, "verified", lambda self, written, *args, **kwargs: None):
        return lookahead.generate(*args, **kwargs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    tasks = {name: [forced_trace_task(r, args.max_new_tokens) for r in loaded]
             for name, loaded in read_traces(TRACES, args.requests, None).items()}
    tasks, vocab = compact_vocabulary(tasks)
    model = build_model(shape=OVERHEAD_SHAPE, vocab=vocab, dtype=torch.float32, device="cpu")
    methods = select_methods(f"greedy,hf prompt lookup k=16,{CHAINS}")
    methods.append((FLOOR, lambda: dict(custom_generate=undrafted, assistant=LookupDrafter(), tree=False)))
    rows = bench_model(model, tasks, methods, repeats=args.repeats, label="file", forward_time=True, summary=overhead_summary)
    by = {(r["file"], r["method"]): r for r in rows}
    table = []
    for file in tasks:
        greedy, floor, chains = (by[file, m]["outside_us_per_step"] for m in ("greedy", FLOOR, CHAINS))
        table.append([file, f"{greedy:.0f}", f"{floor:.0f} ({floor / greedy:.2f}x)", f"{chains:.0f} ({chains / greedy:.2f}x)",
                      f"{chains - floor:.0f} ({(chains - floor) / greedy:.2f}x)",
                      "yes" if all(r["exact"] for r in rows if r["file"] == file) else "NO"])
    print(f"µs outside the forward a step (x greedy's), each request's run with the least of {args.repeats}; "
          f"{args.requests} request(s) a file, ≤{args.max_new_tokens} tokens, float32, torch threads: {torch.get_num_threads()}")
    print(format_table(["file", "greedy", FLOOR, "our chains", "drafting (chains - floor)", "exact"], table))


if __name__ == "__main__":
    main()
