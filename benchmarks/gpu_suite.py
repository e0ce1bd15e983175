"""The GPU run of issue 22: one H200, bfloat16, inside 8 minutes; run by benchmarks/gpu.sh.

Steps, in order of importance, each one `lookahead bench` call in this process (numba's
kernels and torch's paths warmed once for all), each writing its JSON and table as soon as
it ends, so a run cut short keeps what it finished:

1. the trace bench at Qwen2-0.5B's shape: greedy, prompt lookup k=10 and k=16, ours through
   assistant_model= and lookahead.generate (chain and tree);
2. the same at Llama-3.1-8B's shape;
3. the batch bench at 1, 4, 16 and 64 rows, 8B shape;
4. the loop overhead (a 1-layer model: seconds outside the forward per verify step);
5. long prompts: 8k, 16k and 32k tokens of context, 0.5B shape;
6. the model's own predictions at the device's step costs: stories260K through lookahead.generate,
   the default drafter with and without its prediction table (`--blend --time-blend`; where the
   model was carried or ../shared holds it).

A step starts only if its time cap fits in what is left of --budget seconds; it is recorded as
skipped otherwise (the six caps add up past the budget: `--only trees` runs the sixth alone). Outputs in --out: results.json ({step: JSON of the bench}), tables.md (each
step's command, seconds and table) and log.txt. --dry-run: the same steps at a 1-layer toy
shape on whatever device is here, a few tokens each (for the test that keeps this script working).
"""

import argparse
import contextlib
import io
import json
import sys
import time
import traceback
from pathlib import Path

import torch
import transformers

import lookahead
from lookahead.bench.cli import main as lookahead_main

ROOT = Path(__file__).resolve().parents[1]
CARRIED_TRACES = ROOT / "benchmarks" / "carry" / "traces"  # benchmarks/prepare_device.sh writes it
SHARED_TRACES = ROOT.parent / "shared" / "traces"
CARRIED_STORIES = ROOT / "benchmarks" / "carry" / "stories260K"  # and this (the trained tiny Llama)
SHARED_STORIES = ROOT.parent / "shared" / "models" / "stories260K"
# "lookahead.generate lookup alone": the default without the prediction table, what the table costs or adds on a GPU
# (its trees are near free there; on the forced model the table learns the kept path only, docs/benchmarks.md).
TRACE_METHODS = ",".join(["greedy", "hf prompt lookup k=10", "hf prompt lookup k=16", "lookahead assistant_model", "lookahead.generate",
                          "lookahead.generate tree", "lookahead.generate lookup alone"])


def steps(*, dry_run: bool) -> list[tuple[str, int, list[str]]]:
    """(name, time cap in seconds, `lookahead bench` arguments after the traces) per step."""
    small, large = ("tiny", "tiny") if dry_run else ("0.5b", "8b")
    tokens = "12" if dry_run else "128"
    requests = "1" if dry_run else "3"
    trace = ["--dtype", "bfloat16", "--requests", requests, "--max-new-tokens", tokens, "--methods", TRACE_METHODS]
    found = [
        ("trace bench, 0.5B shape", 130, ["--shape", small, *trace]),
        ("trace bench, 8B shape", 150, ["--shape", large, *trace]),
        ("batch bench, 8B shape", 70, ["--batch", "1,2" if dry_run else "1,4,16,64", "--shape", large, "--dtype", "bfloat16",
                                       "--max-new-tokens", "12" if dry_run else "64"]),
        ("loop overhead", 40, ["--loop-overhead", "--dtype", "bfloat16", "--requests", requests, "--max-new-tokens", tokens]),
        ("long context, 0.5B shape", 80, ["--context", "0,64" if dry_run else "8192,16384,32768", "--shape", small, "--dtype", "bfloat16",
                                          "--requests", "1", "--max-new-tokens", tokens]),
    ]
    if stories_model().is_dir():
        # The model's predictions at the device's own step costs (docs/benchmarks.md's table at --forward-cost 20,0.1):
        # the default drafter with the table against lookup alone, greedy and sampled, fresh and kept drafters.
        found.append(("trees at the device's prices, stories260K", 240, [
            "--blend", "--time-blend", "--model", str(stories_model()), "--dtype", "float32", "--requests", "2" if dry_run else "30",
            "--max-new-tokens", "8" if dry_run else "200", "--repeats", "1" if dry_run else "2", "--methods", "lookup,blend"]))
    return found


def stories_model() -> Path:
    """The trained tiny Llama: carried (benchmarks/prepare_device.sh), else ../shared's."""
    return CARRIED_STORIES if CARRIED_STORIES.is_dir() else SHARED_STORIES


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json, tables.md and log.txt")
    parser.add_argument("--traces", type=Path, nargs="+", default=None,
                        help=f"trace files (default: {CARRIED_TRACES.relative_to(ROOT)}/*.jsonl, else ../shared/traces)")
    parser.add_argument("--vocab-size", default=None, help="passed to every step (the default: the traces', Llama-3's)")
    parser.add_argument("--budget", type=float, default=470.0, help="seconds for all the steps")
    parser.add_argument("--dry-run", action="store_true", help="a toy shape and a few tokens: checks the steps, times nothing worth reading")
    parser.add_argument("--only", default=None, help="run only the steps whose name holds this text (e.g. 'trees')")
    args = parser.parse_args(argv)
    paths = args.traces or sorted(CARRIED_TRACES.glob("*.jsonl")) or sorted(SHARED_TRACES.glob("*.jsonl"))
    if not paths:
        print("gpu_suite: no trace files: run benchmarks/prepare_device.sh here and carry benchmarks/carry, or pass --traces", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}, lookahead {lookahead.__version__}"
    results = {"environment": {"device": device, "versions": versions, "dry_run": args.dry_run}}
    tables = [f"# GPU run{' (dry run)' if args.dry_run else ''}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n{device}; {versions}\n"]
    log = (args.out / "log.txt").open("w")
    start = time.perf_counter()
    failed = False
    for name, cap, options in steps(dry_run=args.dry_run):
        if args.only is not None and args.only not in name:
            continue
        left = args.budget - (time.perf_counter() - start)
        if cap > left:
            results[name] = {"skipped": f"its cap of {cap} s exceeds the {left:.0f} s left"}
            tables.append(f"## {name}\n\nskipped: its cap of {cap} s exceeds the {left:.0f} s left\n")
            continue
        json_path = args.out / "step.json"
        argv_step = ["bench", *options, "--traces", *map(str, paths), "--json-out", str(json_path)]
        argv_step += ["--vocab-size", args.vocab_size] if args.vocab_size else []
        shown = "lookahead " + " ".join(f"'{a}'" if " " in a else a for a in argv_step if a != str(json_path)).replace(" --json-out", "")
        print(f"[{time.perf_counter() - start:6.1f} s] {name}: {shown}", file=log, flush=True)
        table, began = io.StringIO(), time.perf_counter()
        try:
            with contextlib.redirect_stdout(table):
                code = lookahead_main(argv_step)
            results[name] = json.loads(json_path.read_text()) if json_path.exists() else {"exit": code}
            failed |= code != 0
        except Exception:  # a failed step is recorded; the next ones still run
            code, failed = None, True
            results[name] = {"error": traceback.format_exc()}
            print(traceback.format_exc(), file=log, flush=True)
        json_path.unlink(missing_ok=True)
        seconds = time.perf_counter() - began
        tables.append(f"## {name}\n\n`{shown}` ({seconds:.0f} s, exit {code})\n\n{table.getvalue()}\n")
        print(f"[{time.perf_counter() - start:6.1f} s] {name}: exit {code} after {seconds:.0f} s", file=log, flush=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")  # after every step: a cut run keeps what it did
        (args.out / "tables.md").write_text("\n".join(tables))
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "tables.md").write_text("\n".join(tables))
    log.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run())
