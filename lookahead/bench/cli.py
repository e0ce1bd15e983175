"""`lookahead` command line: `replay` (model-free τ from traces) and `bench` (wall clock)."""

import argparse
import json
import sys
from pathlib import Path

from lookahead.bench.tables import format_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lookahead", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    replay = commands.add_parser("replay", help="exact tokens per verify step of a drafter on recorded greedy outputs")
    replay.add_argument("files", nargs="+", type=Path, help="trace files (JSON lines, see lookahead/bench/replay.py)")
    replay.add_argument("--drafter", choices=["lookahead", "hf"], default="lookahead")
    replay.add_argument("--num-draft-tokens", type=int, default=None, help="most tokens per draft (default: the drafter's, 64; hf: 16)")
    replay.add_argument("--min-ngram", type=int, default=None, help="shortest anchoring suffix (default: the drafter's)")
    replay.add_argument("--max-ngram", type=int, default=None, help="longest suffix tried (default: the drafter's)")
    replay.add_argument("--draft-factor", type=float, default=None, help="draft at most factor x match_len tokens (default: the drafter's)")
    replay.add_argument("--no-memory", action="store_true", help="no cross-request memory (default: earlier requests of the run)")
    replay.add_argument("--tree", action="store_true", help="draft trees; a step keeps the longest root path the trace follows")
    replay.add_argument("--max-tree-nodes", type=int, default=64, help="tree size limit with --tree")
    replay.add_argument("--hf-ngram", type=int, default=3, help="transformers' max_matching_ngram_size")
    replay.add_argument("--costs", default=None, help="size our drafts as our engine does under this verify-cost curve "
                        "(transformers' are not sized) and report the modelled speedup: 'flat' or costs at blocks of 1,2,4,8,16,32,64 tokens, e.g. "
                        "'1,1.13,1.44,1.75,2.34,2.72,3.49'")
    replay.add_argument("--limit", type=int, default=None, help="replay the first N requests of each file")
    replay.add_argument("--json", action="store_true", help="print one JSON object and nothing else on stdout")

    from lookahead.bench.e2e import add_bench_arguments

    add_bench_arguments(commands.add_parser("bench", help="end-to-end generate() wall clock, exactness checked"))

    args = parser.parse_args(argv)
    try:
        if args.command == "replay":
            return run_replay(args)
        from lookahead.bench.e2e import run_bench

        return run_bench(args)
    except ValueError as e:  # bad input: one clear line, no traceback
        print(f"lookahead {args.command}: error: {e}", file=sys.stderr)
        return 2


def run_replay(args) -> int:
    from lookahead import LookupDrafter
    from lookahead.bench.replay import load_trace, parse_costs, replay_hf, replay_lookahead, replay_recorded, result

    if args.num_draft_tokens is not None and args.num_draft_tokens < 1:
        raise ValueError(f"--num-draft-tokens must be >= 1, got {args.num_draft_tokens}")
    if args.max_tree_nodes < 1:
        raise ValueError(f"--max-tree-nodes must be >= 1, got {args.max_tree_nodes}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    costs = parse_costs(args.costs) if args.costs is not None else None
    results = []
    for path in args.files:
        requests = load_trace(path)[: args.limit]
        name = path.name
        if args.drafter == "lookahead":
            options = dict(num_draft_tokens=args.num_draft_tokens, min_ngram=args.min_ngram, max_ngram=args.max_ngram,
                           draft_factor=args.draft_factor)
            drafter = LookupDrafter(memory=not args.no_memory, **{k: v for k, v in options.items() if v is not None})
            label = (f"lookahead k={drafter.num_draft_tokens} ngram={drafter.min_ngram}..{drafter.max_ngram} "
                     f"factor={drafter.draft_factor:g}")
            label += " no-memory" * args.no_memory + f" tree<={args.max_tree_nodes}" * args.tree + f" costs={args.costs}" * (costs is not None)
            counts = replay_lookahead(requests, drafter, tree=args.tree, max_tree_nodes=args.max_tree_nodes, costs=costs, progress=name)
        else:
            num_draft_tokens = args.num_draft_tokens or 16
            label = f"hf k={num_draft_tokens} ngram={args.hf_ngram}"
            counts = replay_hf(requests, num_draft_tokens=num_draft_tokens, ngram=args.hf_ngram, costs=costs, progress=name)
        results.append(result(name, label, counts))
        recorded = replay_recorded(requests)
        if recorded is not None:
            results.append(result(name, "vllm-ngram (recorded)", recorded))
    if args.json:
        print(json.dumps({"results": [r.as_dict() for r in results]}))
    else:
        speedup = costs is not None
        print(format_table(
            ["file", "drafter", "tau", "steps", "tokens", "drafted", "accepted", "us/step"] + ["modelled speedup"] * speedup,
            [[r.file, r.drafter, f"{r.tau:.3f}", r.steps, r.tokens, r.drafted, r.accepted, f"{r.us_per_step:.1f}"]
             + [f"{r.speedup:.3f}x" if r.speedup else "-"] * speedup for r in results],
        ))
    return 0
