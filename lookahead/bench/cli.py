"""The `lookahead` command: `replay` (model-free tokens per step on trace files) and `bench` (wall clock).

Each command is a subparser built by its own `add_*_parser(commands)` and run by the function
it sets as `run` (`set_defaults(run=...)`): a new command is one such function and one line in
`build_parser`. `replay` stays torch-free: this module imports only the drafting core at load;
the bench modes (torch, transformers) are imported when `bench` runs.
"""

import argparse
import functools
import json
import sys
from pathlib import Path

from lookahead.bench.replay import (
    SOURCES, TRACE_VOCAB_SIZE, drafter_for, load_trace, parse_costs, replay_hf, replay_lookahead, replay_recorded, result,
)
from lookahead.bench.show import add_arguments as add_show_arguments
from lookahead.bench.show import run as run_show
from lookahead.bench.suffix import MAX_SPEC_FACTOR, MAX_TREE_DEPTH, SuffixUnavailableError, cache_class, replay_suffix
from lookahead.bench.tables import format_table

DEFAULT_MAX_NEW_TOKENS = 256  # without --max-new-tokens
DEFAULT_BATCH_MAX_NEW_TOKENS = 64  # --batch without --max-new-tokens: a small default run
TRACE_DOC = "docs/traces.md"  # where the trace format is written down for users
RECORDED = "vllm-ngram (recorded)"  # the drafter column of a trace's recorded reference (acc_ngram)
NOT_RECORDED = "n/a"  # a recorded reference's drafted count and drafting time: the trace does not hold them

DESCRIPTION = """\
Lookup drafts for exact speculative decoding: see how many tokens per model step they would
save on your outputs, and time them against plain generation on a model."""

EPILOG = f"""\
examples:
  lookahead replay outputs.jsonl
      tokens per verify step our drafter would give on a model's recorded greedy outputs; no model
      runs (how to write the file: {TRACE_DOC})
  lookahead bench --quick
      plain generate() against prompt lookup and ours on an offline stand-in model, in about a minute
  lookahead show MODEL --prompt-file prompt.txt --html drafts.html
      the generated text with each kept draft marked by where it came from

`lookahead COMMAND --help` lists a command's options."""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, SuffixUnavailableError) as e:  # bad input, or arctic-inference absent: one clear line, no traceback
        print(f"lookahead {args.command}: error: {e}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lookahead", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    add_replay_parser(commands)
    add_bench_parser(commands)
    add_show_parser(commands)
    return parser


def add_show_parser(commands) -> argparse.ArgumentParser:
    show = commands.add_parser(
        "show", help="run a model on a prompt and show where the drafts came from",
        description="Generates with a LookupDrafter and prints the text with each kept drafted span marked by its source "
                    "(prompt, output so far, memory, documents, the model's predictions), and tokens per forward pass.",
        epilog="example:\n  lookahead show ../shared/models/stories260K --prompt-file story.txt --runs 2 --html drafts.html",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_show_arguments(show)
    show.set_defaults(run=run_show)
    return show


def add_replay_parser(commands) -> argparse.ArgumentParser:
    replay = commands.add_parser(
        "replay", help="tokens per verify step a drafter would give on recorded outputs (no model runs)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Replays recorded greedy outputs through a drafter. Under greedy verification a drafted token is kept\n"
                    "exactly when it equals the recorded next token, so tau (tokens per verify step, the model's own\n"
                    f"token included) is exact without running the model. Trace files: {TRACE_DOC}.",
        epilog="examples:\n"
               "  lookahead replay outputs.jsonl                                     # ours, with memory of earlier requests\n"
               "  lookahead replay outputs.jsonl --tree --limit 20                   # draft trees, on the first 20 requests\n"
               "  lookahead replay outputs.jsonl --drafter hf --num-draft-tokens 16  # transformers' prompt lookup\n"
               "  lookahead replay outputs.jsonl --drafter suffix                    # vLLM's suffix (arctic-inference)")
    replay.set_defaults(run=run_replay)
    replay.add_argument("files", nargs="+", type=Path, help=f"trace files, JSON lines ({TRACE_DOC})")
    replay.add_argument("--drafter", choices=["lookahead", "hf", "suffix"], default="lookahead",
                        help="lookahead: ours (LookupDrafter); hf: transformers' prompt lookup, called as is; suffix: vLLM's "
                             "SuffixDecoding, arctic-inference called as vLLM 0.32 calls it, its defaults (default: lookahead)")
    replay.add_argument("--num-draft-tokens", metavar="N", type=int, default=None,
                        help=f"most tokens per draft (default: the drafter's, 64; hf: 16; suffix: vLLM's, {MAX_TREE_DEPTH})")
    replay.add_argument("--min-ngram", metavar="N", type=int, default=None, help="shortest anchoring suffix (default: the drafter's)")
    replay.add_argument("--max-ngram", metavar="N", type=int, default=None, help="longest suffix tried (default: the drafter's)")
    replay.add_argument("--draft-factor", metavar="FACTOR", type=float, default=None, help=f"draft at most factor x match_len tokens (default: the drafter's; suffix: vLLM's, {MAX_SPEC_FACTOR:g})")
    replay.add_argument("--no-memory", action="store_true", help="no cross-request memory (default: earlier requests of the file)")
    replay.add_argument("--fresh", action="store_true",
                        help="a fresh drafter per request: neither memory nor prediction table kept (default: one drafter for a file)")
    replay.add_argument("--source", choices=SOURCES, default=None,
                        help="draft from lookup alone, the model's predictions alone (traces with topk_token_ids) or both "
                             "(default: blend; without topk_token_ids the table stays empty, so lookup's drafts)")
    replay.add_argument("--tree", action="store_true", help="draft trees; a step keeps the longest root path the trace follows")
    replay.add_argument("--max-tree-nodes", metavar="N", type=int, default=64, help="tree size limit with --tree (default: 64)")
    replay.add_argument("--hf-ngram", metavar="N", type=int, default=3, help="with --drafter hf: transformers' max_matching_ngram_size (default: 3)")
    replay.add_argument("--costs", metavar="COSTS", default=None, help="size our drafts as our engine does under this verify-cost curve "
                        "(transformers' and suffix's are not sized) and report the modelled speedup: 'flat' or costs at blocks of 1,2,4,8,16,32,64 tokens, e.g. "
                        "'1,1.13,1.44,1.75,2.34,2.72,3.49'")
    replay.add_argument("--limit", metavar="N", type=int, default=None, help="replay the first N requests of each file")
    replay.add_argument("--json", action="store_true", help="print one JSON object and nothing else on stdout")
    return replay


def _forward_cost(text: str) -> tuple[float, float]:
    try:
        fixed, per_token = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MS,MS_PER_TOKEN (two numbers), got {text!r}") from None
    if fixed < 0 or per_token < 0:
        raise argparse.ArgumentTypeError(f"the costs must be >= 0, got {text!r}")
    return fixed, per_token


BENCH_DESCRIPTION = """\
Times whole generate() calls, plain greedy against transformers' prompt lookup and ours, each
output checked against the reference (or plain greedy's). Without --model the model is an
offline stand-in: random weights of a real model's shape whose greedy choice is forced to a
reference output (built-in workloads: a code edit, a summary, a chat answer; or --traces), so
every cost is real and every drafted token is kept exactly when the reference says so."""

BENCH_EPILOG = f"""\
examples:
  lookahead bench --quick                                  # the comparison in about a minute, offline
  lookahead bench                                          # 3 requests per workload, 256 new tokens, a 0.5B shape
  lookahead bench --model Qwen/Qwen2.5-0.5B-Instruct       # a real model (downloads it), the same prompts
  lookahead bench --traces outputs.jsonl                   # recorded outputs ({TRACE_DOC}), float32 and bfloat16
  lookahead bench --batch 1,4,16                           # batches of trace requests through lookahead.generate"""


def add_bench_parser(commands) -> argparse.ArgumentParser:
    bench = commands.add_parser("bench", help="time generate() with and without drafts; outputs checked equal",
                                description=BENCH_DESCRIPTION, epilog=BENCH_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.set_defaults(run=run_bench)
    add_bench_arguments(bench)
    return bench


def add_bench_arguments(parser) -> None:
    workload = parser.add_argument_group("workload", "what is generated, on which model")
    workload.add_argument("--model", metavar="NAME_OR_PATH", default=None, help="hub name or local folder of a causal LM (default: random weights, forced)")
    workload.add_argument("--prompts", metavar="FILE", type=Path, default=None, help="with --model: JSON lines with a 'prompt' text each; with --blend and --write-trace, one plain text a line")
    workload.add_argument("--traces", metavar="FILE", type=Path, nargs="+", default=None,
                          help=f"recorded trace files (prompt and generated token ids, {TRACE_DOC}) instead of built-in workloads")
    workload.add_argument("--vocab-size", metavar="N", type=int, default=None,
                          help=f"vocabulary of the forced model with --traces (default {TRACE_VOCAB_SIZE}, Llama-3's); every trace id must be below it")
    workload.add_argument("--requests", metavar="N", type=int, default=3, help="requests per workload: the first N of each trace file (default: 3)")
    workload.add_argument("--max-new-tokens", metavar="N", type=int, default=None,
                          help=f"most tokens per request (a trace's recorded output is cut there; default {DEFAULT_MAX_NEW_TOKENS}, "
                               f"{DEFAULT_BATCH_MAX_NEW_TOKENS} with --batch)")
    workload.add_argument("--prompt-tokens", metavar="N", type=int, default=None,
                          help="with --batch, --cold or --rows: each prompt's last N tokens (default 256 with --batch and --rows, 200 with --cold)")
    workload.add_argument("--shape", choices=["0.5b", "quick", "8b", "tiny"], default=None,
                          help="the forced model's shape: Qwen2-0.5B's (the default), a small one, hidden 512 and 8 layers (as --quick), Llama-3.1-8B's (for a GPU) "
                               "or a 1-layer toy (dry runs); --context and --cold default to quick")
    workload.add_argument("--dtype", metavar="DTYPES", default=None,
                          help="float32, bfloat16, auto (bfloat16 on CUDA, float32 on CPU) or a comma list, e.g. float32,bfloat16: "
                               "one model per dtype, each timed (default: float32,bfloat16 with --traces, else auto)")

    methods = parser.add_argument_group("methods", "what is compared (plain greedy and prompt lookup are the baselines)")
    methods.add_argument("--variants", action="store_true",
                         help="also time prompt lookup k=10, our chain-only and tree-only engine, and our unsized drafts")
    methods.add_argument("--methods", metavar="NAMES", default=None,
                         help="a comma list of the methods to time, by the names the table prints (greedy and "
                              "'hf prompt lookup k=16' always among them; default: greedy, 'hf prompt lookup k=16', "
                              "'lookahead assistant_model', 'lookahead.generate', every one with --variants; with --time-blend: "
                              "plain, lookup, blend, unsized (the blend's whole trees), lookup always among them)")

    timing = parser.add_argument_group("timing", "how long a run is and how it is timed")
    timing.add_argument("--quick", action="store_true",
                        help="the smallest run that shows the comparison, about a minute on a CPU: a code edit and a chat "
                             "answer, 1 request each, 64 new tokens, the small shape, greedy, prompt lookup and ours (assistant_model=)")
    timing.add_argument("--repeats", metavar="N", type=int, default=1,
                        help="run everything N times; report each request's fastest run, and the min-max of the runs' ratios (default: 1)")
    timing.add_argument("--forward-cost", type=_forward_cost, default=None, metavar="MS,MS_PER_TOKEN",
                        help="with --time-blend: every forward also sleeps MS + MS_PER_TOKEN * its tokens (a bigger model's "
                             "cost curve beside the real model's predictions), torch on one thread; e.g. 20,0.1 (a GPU's) or 20,4 (a CPU's)")

    timing.add_argument("--busy", metavar="N", type=int, default=0,
                        help="time with N other jobs each holding a core (busy loops), the methods taking turns under the "
                             "same load: a busy machine beside a quiet one (default: 0)")

    modes = parser.add_argument_group("other measurements", "instead of the table of methods; one at a time")
    modes.add_argument("--batch", metavar="SIZES", default=None,
                       help="batch sizes, e.g. 1,4,16: plain batched greedy vs lookahead.generate on one left-padded batch of trace "
                            "requests per size (--traces, default ../shared/traces; skipped where absent)")
    modes.add_argument("--cold", action="store_true",
                       help="a fresh process's first generate() call per method against plain greedy's, each in a process of its own "
                            "with an empty home directory (--traces, default ../shared/traces; skipped where absent; --shape default quick)")
    modes.add_argument("--fresh-kernels", action="store_true",
                       help="with --cold: numba's cache of the drafting kernels empty too, as in a fresh install's first process")
    modes.add_argument("--context", metavar="TOKENS", default=None,
                       help="long prompts: a comma list of context sizes in tokens, e.g. 8192,16384,32768; other trace requests' "
                            "prompts and outputs that long are prepended to each prompt, or given to our drafters as documents "
                            "(--traces, default ../shared/traces; skipped where absent)")
    modes.add_argument("--overhead", action="store_true", help="per-step drafting cost and bytes per token vs context length")
    modes.add_argument("--loop-overhead", action="store_true",
                       help="each method's seconds outside the forward per verify step, on a 1-layer model over trace requests "
                            "(--traces, default ../shared/traces; skipped where absent)")
    modes.add_argument("--rows", metavar="SIZES", default=None,
                       help="with --loop-overhead: batch sizes, e.g. 4,16: also plain batched greedy vs lookahead.generate on one "
                            "left-padded batch of trace requests per size, seconds outside the forward per row-step")
    modes.add_argument("--documents", action="store_true", help="RAG-style drafting from a document library: prefiltered vs indexing everything")
    modes.add_argument("--blend", action="store_true",
                       help="with --model: tokens per step of lookup alone, the model's own predictions alone and their blend, "
                            "unsized, greedy and sampled, one drafter kept and a fresh one per request (built-in story openings "
                            "or --prompts, one text a line)")
    modes.add_argument("--time-blend", action="store_true",
                       help="with --blend: instead of tokens per step, ms per new token of plain generate and of the default "
                            "drafter with and without predictions, greedy and sampled, fresh and kept drafters (--repeats, the methods taking turns)")
    modes.add_argument("--write-trace", metavar="FILE", type=Path, default=None,
                       help=f"with --model: write a trace to this file ({TRACE_DOC}) of the model's "
                            "greedy outputs with its top-8 ids at every position, for `lookahead replay` (built-in story "
                            "openings or --prompts; --requests, --max-new-tokens)")

    output = parser.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print one JSON object and nothing else on stdout")
    output.add_argument("--json-out", metavar="FILE", type=Path, default=None, help="also write that JSON object to this file (the table still printed)")
    output.add_argument("--plot", metavar="FILE", type=Path, default=None, help="write a chart of speedup per workload and method (needs matplotlib)")


def run_bench(args) -> int:
    """`lookahead bench`: options checked, defaults resolved, then the mode asked for."""
    if args.max_new_tokens is None:
        args.max_new_tokens = DEFAULT_BATCH_MAX_NEW_TOKENS if args.batch is not None else DEFAULT_MAX_NEW_TOKENS
    if args.requests < 1 or args.max_new_tokens < 1:  # before --quick sets its own
        raise ValueError(f"--requests and --max-new-tokens must be >= 1, got {args.requests} and {args.max_new_tokens}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.busy < 0:
        raise ValueError(f"--busy must be >= 0, got {args.busy}")
    if args.prompt_tokens is not None and ((args.batch is None and not args.cold and args.rows is None) or args.prompt_tokens < 1):
        raise ValueError(f"--prompt-tokens cuts the prompts of --batch, --cold or --rows, and must be >= 1, got {args.prompt_tokens}")
    if args.rows is not None and not args.loop_overhead:
        raise ValueError("--rows is an option of --loop-overhead")
    if args.fresh_kernels and not args.cold:
        raise ValueError("--fresh-kernels is an option of --cold")
    modes = [flag for flag, on in (("--batch", args.batch is not None), ("--cold", args.cold), ("--loop-overhead", args.loop_overhead),
                                   ("--context", args.context is not None), ("--overhead", args.overhead),
                                   ("--documents", args.documents), ("--blend", args.blend),
                                   ("--write-trace", args.write_trace is not None)) if on]
    if len(modes) > 1:
        raise ValueError(f"{' and '.join(modes)}: one bench mode at a time")
    if modes and modes[0] in ("--batch", "--cold", "--loop-overhead", "--context") and (args.model or args.prompts):
        raise ValueError(f"{modes[0]} runs the forced model on trace requests: it does not take --model or --prompts")
    # Imported here, not at the top: they load torch and transformers, which `replay` never needs.
    from lookahead.bench.timing import busy_load

    if args.busy:
        print(f"lookahead bench: {args.busy} busy-loop job(s) hold cores while it runs", file=sys.stderr)
    with busy_load(args.busy):
        return _run_mode(args)


def _run_mode(args) -> int:
    from lookahead.bench import batched, blend, cold, e2e, long_context, loop_overhead, write_trace

    if args.write_trace is not None:
        return write_trace.run_write_trace(args)
    if args.blend:
        return blend.run_blend_bench(args)
    if args.batch is not None:
        return batched.run_batch_bench(args)
    if args.cold:
        return cold.run_cold(args)
    if args.loop_overhead:
        return loop_overhead.run_loop_overhead(args)
    if args.context is not None:
        return long_context.run_long_context(args)
    return e2e.run_bench(args)


def run_replay(args) -> int:
    if args.num_draft_tokens is not None and args.num_draft_tokens < 1:
        raise ValueError(f"--num-draft-tokens must be >= 1, got {args.num_draft_tokens}")
    if args.max_tree_nodes < 1:
        raise ValueError(f"--max-tree-nodes must be >= 1, got {args.max_tree_nodes}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    if args.drafter == "hf" and (args.source is not None or args.fresh):
        raise ValueError("--source and --fresh are options of --drafter lookahead")
    if args.drafter == "suffix":
        theirs = [flag for flag, given in (("--source", args.source is not None), ("--fresh", args.fresh), ("--tree", args.tree),
                                           ("--min-ngram", args.min_ngram is not None), ("--max-ngram", args.max_ngram is not None))
                  if given]
        if theirs:
            raise ValueError(f"{', '.join(theirs)}: not options of --drafter suffix (it takes --num-draft-tokens, --draft-factor, "
                             "--no-memory, --costs)")
        cache_class()  # arctic-inference imports, or one line that says how to install it, before any file is read
    source = args.source or "blend"
    costs = parse_costs(args.costs) if args.costs is not None else None
    results = []
    for path in args.files:
        requests = load_trace(path)[: args.limit]
        name = path.name
        if args.drafter == "lookahead":
            topk = any(r.topk is not None for r in requests)
            if source == "table" and not topk:
                raise ValueError(f"--source table drafts from the model's predictions, and {path} carries none (topk_token_ids)")
            options = dict(num_draft_tokens=args.num_draft_tokens, min_ngram=args.min_ngram, max_ngram=args.max_ngram,
                           draft_factor=args.draft_factor)
            options = dict(memory=not args.no_memory, **{k: v for k, v in options.items() if v is not None})
            drafter = drafter_for(source, **options)
            label = (f"lookahead k={drafter.num_draft_tokens} ngram={drafter.min_ngram}..{drafter.max_ngram} "
                     f"factor={drafter.draft_factor:g}")
            label += " no-memory" * args.no_memory + " fresh" * args.fresh + f" {source}" * (topk or args.source is not None)
            label += f" tree<={args.max_tree_nodes}" * args.tree + f" costs={args.costs}" * (costs is not None)
            if args.fresh:
                drafter = functools.partial(drafter_for, source, **options)
            counts = replay_lookahead(requests, drafter, tree=args.tree, max_tree_nodes=args.max_tree_nodes, costs=costs, progress=name)
        elif args.drafter == "suffix":
            num_draft_tokens = args.num_draft_tokens or MAX_TREE_DEPTH
            factor = MAX_SPEC_FACTOR if args.draft_factor is None else args.draft_factor
            label = f"vllm suffix k={num_draft_tokens} depth={MAX_TREE_DEPTH} factor={factor:g}" + " no-memory" * args.no_memory
            counts = replay_suffix(requests, num_draft_tokens=num_draft_tokens, max_spec_factor=factor, memory=not args.no_memory,
                                   costs=costs, progress=name)
        else:
            num_draft_tokens = args.num_draft_tokens or 16
            label = f"hf k={num_draft_tokens} ngram={args.hf_ngram}"
            counts = replay_hf(requests, num_draft_tokens=num_draft_tokens, ngram=args.hf_ngram, costs=costs, progress=name)
        results.append(result(name, label, counts))
        recorded = replay_recorded(requests)
        if recorded is not None:
            results.append(result(name, RECORDED, recorded))
    if args.json:
        print(json.dumps({"results": [r.as_dict() for r in results]}))
    else:
        print(replay_table(results, speedup=costs is not None))
    return 0


def replay_table(results, *, speedup: bool = False) -> str:
    """`lookahead replay`'s table. A recorded reference's row shows NOT_RECORDED where the trace holds no figure
    (drafted tokens, drafting time), and a line under the table says what the row is."""
    rows = []
    for r in results:
        drafted = NOT_RECORDED if r.drafted is None else r.drafted
        us_per_step = NOT_RECORDED if r.us_per_step is None else f"{r.us_per_step:.1f}"
        rows.append([r.file, r.drafter, f"{r.tau:.3f}", r.steps, r.tokens, drafted, r.accepted, us_per_step]
                    + [f"{r.speedup:.3f}x" if r.speedup else "-"] * speedup)
    table = format_table(["file", "drafter", "tau", "steps", "tokens", "drafted", "accepted", "us/step"] + ["modelled speedup"] * speedup,
                         rows)
    if any(r.drafter == RECORDED for r in results):
        table += (f"\n{RECORDED}: vLLM's n-gram proposer on the same outputs, as the trace recorded it (acc_ngram); "
                  f"a trace holds no drafted count or drafting time ({NOT_RECORDED}).")
    return table
