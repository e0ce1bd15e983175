"""`lookahead bench --cold`: a fresh process's first generate() call, ours against plain greedy.

What a user waits for after `import` and loading a model: every CLI run, notebook restart,
worker or serverless start pays its first call's one-time work (calibration, kernel
warm-up, torch's first-shape costs). Each (dtype, request, method, repeat) runs in a process
of its own with an empty home directory (no cache there) that builds the forced model
(traces.build_model, random weights of --shape at the traces' vocabulary, its greedy choice
forced in the forward) and times one generate() call; the methods take turns, so load hits
all alike. numba's cache of the drafting kernels, written beside the package by its first
process, is kept (an installed package's state); `--fresh-kernels` empties it too. Reported: each method's fastest call, and the min-max of the repeats' own ratios
to greedy; and the whole process as a user's script runs it (`import torch, transformers`,
then lookahead, the model built, the call), from its first line to the call's end.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

from tqdm import tqdm

from lookahead.bench.replay import TRACE_VOCAB_SIZE
from lookahead.bench.tables import format_table, json_report
from lookahead.bench.traces import forced_trace_task, parse_dtypes, read_traces, shape_for, trace_paths

METHODS = ("greedy", "lookahead assistant_model", "lookahead.generate")
DEFAULT_PROMPT_TOKENS = 200  # --cold without --prompt-tokens


def run_cold(args) -> int:
    """Runs `lookahead bench --cold`; 0 when every call is exact (or there are no traces: skipped)."""
    paths = trace_paths(args, "--cold")
    if not paths:
        return 0
    dtypes = [str(d).removeprefix("torch.") for d in parse_dtypes(args.dtype or "float32,bfloat16", device="cpu", traces=True)]
    shape = shape_for(args, default="quick")
    prompt_tokens = args.prompt_tokens or DEFAULT_PROMPT_TOKENS
    per_file = read_traces(list(paths), args.requests, TRACE_VOCAB_SIZE)
    pooled = [request for group in zip(*per_file.values()) for request in group][: args.requests]  # the files in turn
    tasks = [forced_trace_task(r, args.max_new_tokens) for r in pooled]
    tasks = [dict(prompt=t.prompt[-prompt_tokens:], reference=t.reference, eos=t.eos_token_id) for t in tasks]
    calls = {}  # (dtype, request, method) -> [result per repeat]
    total = args.repeats * len(dtypes) * len(tasks) * len(METHODS)
    with tqdm(total=total, file=sys.stderr, leave=False, unit="process") as bar:
        for _ in range(args.repeats):
            for dtype in dtypes:
                for i, task in enumerate(tasks):
                    for method in METHODS:
                        bar.set_description(f"{dtype} request {i + 1} {method}")
                        result = cold_call(dict(shape=shape, dtype=dtype, method=method, **task), fresh_kernels=args.fresh_kernels)
                        calls.setdefault((dtype, i, method), []).append(result)
                        bar.update()
    rows = summarize(calls, dtypes, len(tasks), args.repeats)
    shape_name = args.shape or "quick"
    if not json_report(args, {"shape": shape_name, "fresh_kernels": args.fresh_kernels, "prompt_tokens": prompt_tokens, "max_new_tokens": args.max_new_tokens,
                              "requests": len(tasks), "repeats": args.repeats, "results": rows}):
        print(("a fresh install's" if args.fresh_kernels else "a fresh process's") + f" first generate() call, forced random Qwen2 of shape {shape_name} ({shape['hidden_size']} hidden, {shape['num_hidden_layers']} layers) at vocab {TRACE_VOCAB_SIZE}; "
              f"{len(tasks)} request(s), each prompt's last {prompt_tokens} tokens, at most {args.max_new_tokens} new tokens; "
              f"tau: tokens per forward pass (the drafter's stats); seconds: the requests' summed fastest of {args.repeats} calls; vs greedy: greedy's seconds over the method's "
              "(above 1: faster), in brackets the min-max over the repeats")
        print(format_table(["dtype", "method", "first call s", "vs greedy", "process s", "vs greedy", "tau", "exact"],
                           [[r["dtype"], r["method"], f"{r['seconds']:.2f}", f"{r['vs_greedy']:.2f}x ({r['vs_greedy_min']:.2f}-{r['vs_greedy_max']:.2f})",
                             f"{r['process_s']:.2f}", f"{r['process_vs_greedy']:.2f}x ({r['process_vs_greedy_min']:.2f}-{r['process_vs_greedy_max']:.2f})",
                             f"{r['tau']:.2f}", "yes" if r["exact"] else "NO"] for r in rows]))
    return 0 if all(r["exact"] for r in rows) else 1


def summarize(calls: dict, dtypes: list[str], requests: int, repeats: int) -> list[dict]:
    rows = []
    for dtype in dtypes:
        row = {m: dict(dtype=dtype, method=m) for m in METHODS}
        for key, name in (("seconds", "vs_greedy"), ("process_s", "process_vs_greedy")):
            fastest = {m: sum(min(c[key] for c in calls[dtype, i, m]) for i in range(requests)) for m in METHODS}
            for method in METHODS:
                per_run = [sum(calls[dtype, i, "greedy"][k][key] for i in range(requests))
                           / sum(calls[dtype, i, method][k][key] for i in range(requests)) for k in range(repeats)]
                row[method].update({key: fastest[method], name: fastest["greedy"] / fastest[method],
                                    f"{name}_min": min(per_run), f"{name}_max": max(per_run)})
        for method in METHODS:
            results = [c for i in range(requests) for c in calls[dtype, i, method]]
            rows.append(dict(row[method], tau=sum(c["tau"] for c in results) / len(results), exact=all(c["exact"] for c in results)))
    return rows


def cold_call(spec: dict, *, fresh_kernels: bool = False) -> dict:
    """One generate() call in a fresh Python process with an empty home directory; its result (child's JSON).
    fresh_kernels: numba's cache of the drafting kernels (beside the package, written by the
    install's first process) empty too, as on a fresh install that never ran."""
    with tempfile.TemporaryDirectory(prefix="lookahead-cold-home-") as home:
        env = {**os.environ, "HOME": home, "XDG_CACHE_HOME": os.path.join(home, ".cache")}
        env.pop("HF_HOME", None)
        if fresh_kernels:
            env["NUMBA_CACHE_DIR"] = os.path.join(home, "numba")
        script = ("import time; started = time.perf_counter()\nimport torch, transformers\n"
                  "from lookahead.bench.cold import child_main; child_main(started)")  # a user's script, in its order
        done = subprocess.run([sys.executable, "-c", script, json.dumps(spec)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the cold process failed ({spec['method']}, {spec['dtype']}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def child(spec: dict) -> dict:
    """In the fresh process: the model built, then one timed generate() call."""
    import torch

    import lookahead
    from lookahead import LookupDrafter
    from lookahead.bench.timing import timed_generate
    from lookahead.bench.traces import build_model, force_reference, forced_options

    model = build_model(shape=spec["shape"], vocab=TRACE_VOCAB_SIZE, dtype=getattr(torch, spec["dtype"]), device="cpu")
    prompt, reference = spec["prompt"], spec["reference"]
    options = dict(max_new_tokens=len(reference), do_sample=False, eos_token_id=spec["eos"], pad_token_id=spec["eos"])
    drafter = None
    if spec["method"] == "lookahead assistant_model":
        options["assistant_model"] = drafter = LookupDrafter()
    elif spec["method"] == "lookahead.generate":
        options.update(custom_generate=lookahead.generate, assistant=(drafter := LookupDrafter()))
    with force_reference(model, len(prompt), reference):
        out, timing = timed_generate(model, torch.tensor([prompt]), forced_options(options))
    written = out[0, len(prompt) :].tolist()
    return dict(seconds=timing.seconds, first_token_s=timing.first_token_s, tokens=len(written), forwards=timing.forwards, ended=time.perf_counter(),
                exact=written == reference, tau=drafter.stats.tau if drafter is not None else 1.0)


def child_main(started: float) -> None:
    """The child's entry (cold_call's script): prints child()'s result and process_s, its first line to the call's end."""
    result = child(json.loads(sys.argv[1]))
    result["process_s"] = result.pop("ended") - started
    print(json.dumps(result))
