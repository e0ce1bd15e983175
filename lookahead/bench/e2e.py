"""`lookahead bench`: real generate() calls, side by side in one run, outputs compared token for token.

Methods (`methods`): plain greedy, transformers' prompt lookup (k=16, ngram 3), ours through
`assistant_model=LookupDrafter()` and through `lookahead.generate`, defaults; `--variants`
adds more. Each takes its turn on every request (`time_methods`, the one timing loop), one
drafter per method serving all of a workload's requests; each request timed whole, with its
time to first token and time per output token after it (timing.py). Default model: random
weights with a 0.5B shape (--shape), its greedy choice forced in the forward to the workload's
reference (traces.force_reference): the built-in workloads, or `--traces` (recorded outputs,
at the traces' real vocabulary). `--model` runs a real model instead. `--overhead` measures
per-step drafting cost and index memory against context length; `--documents`, drafting
from a document library. Other modes: batched.py, loop_overhead.py, long_context.py.
"""

import json
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import transformers
from tqdm import tqdm
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

import lookahead
from lookahead import DocumentLibrary, LookupDrafter
from lookahead.bench import workloads as wl
from lookahead.bench.replay import TRACE_VOCAB_SIZE, TraceRequest, replay_lookahead
from lookahead.bench.tables import format_table, json_report
from lookahead.bench.timing import Timing, timed_generate
from lookahead.bench.traces import (
    Task, build_model, describe, force_reference, forced_options, forced_trace_task, load_model, parse_dtypes, read_traces, shape_for,
)
from lookahead.integrations.calibration import loop_costs
from lookahead.integrations.support import tree_support

OVERHEAD_CONTEXTS = [1_000, 8_000, 32_000, 128_000, 1_000_000]
HF_OVERHEAD_MAX_CONTEXT = 128_000
PLD = "hf prompt lookup k=16"
# --quick: the smallest run that still shows the comparison. A workload where lookup pays (code-edit) and one
# with little to copy (chat), one request each, 64 new tokens, the small shape (traces.QUICK_SHAPE); plain
# greedy and prompt lookup (the ratios' baselines) against ours as the README's one change (assistant_model=).
# --methods or --variants replace its methods; --traces and --model's --prompts, its workloads.
QUICK = dict(workloads=("code-edit", "chat"), requests=1, max_new_tokens=64, methods=("greedy", PLD, "lookahead assistant_model"))


def run_bench(args) -> int:
    """The traces / built-in workloads mode, --overhead or --documents; options already checked (cli.run_bench)."""
    if args.plot:
        _import_pyplot()  # up front, not after the whole benchmark has run
    if args.overhead:
        rows = measure_overhead(quick=args.quick)
        if not json_report(args, {"overhead": rows}):
            print(format_table(["context", "drafter", "us/step", "bytes/token"], [[r["context"], r["drafter"], r["us_per_step"], r["bytes_per_token"]] for r in rows]))
        return 0
    if args.documents:
        rows = measure_documents(quick=args.quick)
        if not json_report(args, {"documents": rows}):
            print(format_table(
                ["documents", "mode", "tau", "one-time s", "setup ms/request", "us/step", "index MB"],
                [[r["library_docs"], r["mode"], f"{r['tau']:.3f}", f"{r['one_time_s']:.2f}", f"{r['setup_ms_per_request']:.2f}", f"{r['us_per_step']:.1f}", f"{r['index_mb']:.1f}"] for r in rows],
            ))
        return 0
    if args.quick:
        args.requests, args.max_new_tokens = QUICK["requests"], QUICK["max_new_tokens"]
        if args.methods is None and not args.variants:
            args.methods = ",".join(QUICK["methods"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = parse_dtypes(args.dtype, device=device, traces=bool(args.traces))
    chosen = select_methods(args.methods, variants=args.variants)
    tasks, vocab = load_tasks(args)
    label = "file" if args.traces else "workload"
    counts = sorted({len(requests) for requests in tasks.values()})  # what was read: a prompts file may hold fewer than --requests
    requests = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    rows, described, trees = [], None, {}
    for dtype in dtypes:
        model = model_for(args, dtype, device, vocab)
        described = described or describe(model, args.model)
        rows += bench_model(model, tasks, chosen, repeats=args.repeats, label=label)
        trees[str(dtype).removeprefix("torch.")] = tree_choice(model)
        del model
    if not json_report(args, {"device": device, "model": described, "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
                              "requests": counts[-1], "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                              "tree_none": trees, "results": rows}):
        print(f"model: {described}, {device}; {requests} request(s) per {label}, at most {args.max_new_tokens} new tokens each")
        if any(name.startswith("lookahead.generate") for name, _ in chosen):  # what our loop's default decided
            print("tree=None (lookahead.generate's default) drafted " + ", ".join(
                f"{t['drafts']} in {dtype} " + ("" if t["tree_over_chain"] is None else
                                                f"(a tree step {t['tree_over_chain']:.2f}x a chain step of its width)")
                for dtype, t in trees.items()))
        print("tokens/s: generated tokens / wall time of whole generate() calls (prefill included, as a user sees it); "
              "TTFT: mean time to first token (the end of the first forward pass, the prefill); TPOT: time per output token "
              "after the first, (wall - TTFT) / (tokens - 1), the decoding this library speeds up; "
              f"speedup, vs PLD: wall-clock speed over greedy and over {PLD}, TPOT x: decoding speed over greedy, TPOT vs PLD: over PLD, all from the same run"
              + (f" (each request's fastest of {args.repeats} runs; in brackets the min-max of the runs' own ratios)" if args.repeats > 1 else "")
              + "; tau: generated tokens / forward passes of the target; exact: output equal to "
              + ("plain greedy's" if args.model else "the reference"))
        print(format_table(
            [label, "dtype", "method", "tokens/s", "speedup", "vs PLD k=16", "TTFT ms", "TPOT ms", "TPOT x", "TPOT vs PLD", "tau", "exact"],
            [[r[label], r["dtype"], r["method"], f"{r['tokens_per_s']:.1f}", spread(r, "speedup"), spread(r, "vs_pld"), f"{r['ttft_ms']:.1f}",
              _ms(r["tpot_ms"]), spread(r, "decode_speedup"), spread(r, "decode_vs_pld"), f"{r['tau']:.2f}", "yes" if r["exact"] else "NO"]
             for r in rows],
        ))
    if args.plot:
        plot(rows, args.plot, label=label)
    return 0 if all(r["exact"] for r in rows) else 1


def tree_choice(model) -> dict:
    """What `tree=None` drafted on `model` by the end of the runs ("trees", "chains", or "undecided"
    where too few tree steps were timed) and what it decided by (LoopCosts.trees): the ratio of our
    tree steps over chain steps of their width, as the process's calls learnt them, and what their
    trees promised over their chains."""
    if tree_support(model) is not None:
        return {"drafts": "chains", "tree_over_chain": None, "tree_gain": None}
    costs = loop_costs(model)
    ratio, trees = costs.tree_ratio(), costs.trees()
    drafts = "undecided" if trees is None else "trees" if trees else "chains"
    return {"drafts": drafts, "tree_over_chain": None if ratio is None else round(ratio, 3), "tree_gain": round(costs.tree_gain, 3)}


def load_tasks(args) -> tuple[dict[str, list[Task]], int | None]:
    """Per workload (or trace file), its requests; and the forced model's vocabulary (None with --model)."""
    if args.vocab_size is not None and (args.model or not args.traces):
        raise ValueError("--vocab-size sets the forced model's vocabulary with --traces (the built-in workloads and --model bring their own)")
    if args.model:
        if args.traces:
            return {name: [Task(r.prompt.tolist(), None, None, args.max_new_tokens) for r in requests]
                    for name, requests in read_traces(args.traces, args.requests, None).items()}, None
        tokenizer = load_model(transformers.AutoTokenizer, args.model)
        if args.prompts:
            texts = {args.prompts.name: [_read_prompt(args.prompts, i, line) for i, line in enumerate(args.prompts.read_text().splitlines(), 1) if line.strip()][: args.requests]}
        else:
            texts = {name: [p for p, _ in pairs] for name, pairs in built_in_workloads(args).items()}
        return {name: [Task(_chat_ids(tokenizer, p), None, None, args.max_new_tokens) for p in prompts] for name, prompts in texts.items()}, None
    if args.prompts:
        raise ValueError("--prompts needs --model: the forced default model writes the built-in references")
    if args.traces:
        vocab = TRACE_VOCAB_SIZE if args.vocab_size is None else args.vocab_size
        if vocab < 2:
            raise ValueError(f"--vocab-size must be >= 2, got {vocab}")
        return {name: [forced_trace_task(r, args.max_new_tokens) for r in requests]
                for name, requests in read_traces(args.traces, args.requests, vocab).items()}, vocab
    bpe = wl.tokenizer()
    pairs = built_in_workloads(args)
    eos = bpe.token_to_id(wl.EOS)
    return {name: [Task(r.prompt, r.reference, eos, len(r.reference)) for r in wl.encode(bpe, p, args.max_new_tokens)] for name, p in pairs.items()}, wl.VOCAB_SIZE


def built_in_workloads(args) -> dict[str, list[tuple[str, str]]]:
    """The built-in workloads' (prompt, reference) pairs, --requests of each; with --quick, QUICK's workloads alone."""
    pairs = wl.make_workloads(requests=args.requests)
    return {name: pairs[name] for name in QUICK["workloads"]} if args.quick else pairs


def spread(row: dict, key: str) -> str:
    """A ratio as '1.23x', with its runs' min-max in brackets where there were several; '-' where undefined."""
    if row[key] is None:
        return "-"
    low, high = row.get(f"{key}_min"), row.get(f"{key}_max")
    return f"{row[key]:.2f}x" + (f" ({low:.2f}-{high:.2f})" if low is not None else "")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def model_for(args, dtype: torch.dtype, device: str, vocab: int | None):
    """The model timed: --model's, or random weights of traces.shape_for(args) at `vocab`."""
    if args.model:
        return load_model(transformers.AutoModelForCausalLM, args.model, dtype=dtype).to(device).eval()
    return build_model(shape=shape_for(args), vocab=vocab, dtype=dtype, device=device)


def _read_prompt(path: Path, line_no: int, line: str) -> str:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{line_no}: not JSON ({e.msg})") from None
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
        raise ValueError(f"{path}:{line_no}: expected an object with a 'prompt' string")
    return row["prompt"]


def _chat_ids(tokenizer, prompt: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=False)
    return tokenizer(prompt)["input_ids"]



def methods(*, variants: bool = False) -> list[tuple[str, Callable[[], dict]]]:
    """(name, make) of every method timed: make() gives the generate() options for one
    workload's requests, called once per workload so one drafter serves all its requests
    (cross-request memory works as it does for a user), fresh per workload."""
    pld = lambda k: lambda: dict(prompt_lookup_num_tokens=k, max_matching_ngram_size=3)  # noqa: E731
    engine = lambda **options: dict(custom_generate=lookahead.generate, **options)  # noqa: E731
    core = [
        ("greedy", lambda: {}),
        (PLD, pld(16)),
        ("lookahead assistant_model", lambda: dict(assistant_model=LookupDrafter())),
        ("lookahead.generate", lambda: engine(assistant=LookupDrafter())),
    ]
    if not variants:
        return core
    unsized = lambda **options: LookupDrafter(cost_aware=False, **options)  # noqa: E731
    return core + [
        ("hf prompt lookup k=10", pld(10)),
        ("lookahead.generate chain", lambda: engine(assistant=LookupDrafter(), tree=False)),
        ("lookahead.generate tree", lambda: engine(assistant=LookupDrafter(), tree=True)),
        ("lookahead.generate lookup alone", lambda: engine(assistant=LookupDrafter(predictions=False))),
        ("lookahead assistant_model unsized k=16", lambda: dict(assistant_model=unsized(num_draft_tokens=16))),
        ("lookahead.generate chain unsized k=16", lambda: engine(assistant=unsized(num_draft_tokens=16), tree=False)),
        ("lookahead.generate tree unsized 32 nodes", lambda: engine(assistant=unsized(), tree=True, max_tree_nodes=32)),
    ]


def select_methods(spec: str | None, *, variants: bool = False) -> list[tuple[str, Callable[[], dict]]]:
    """--methods: the named methods in the order given (greedy and PLD, the ratios' baselines, required); None: methods(variants=...)."""
    if spec is None:
        return methods(variants=variants)
    known = dict(methods(variants=True))
    names = [name.strip() for name in spec.split(",")]
    unknown = next((name for name in names if name not in known), None)
    if unknown is not None:
        raise ValueError(f"--methods: no method {unknown!r}; the methods are: {', '.join(known)}")
    if "greedy" not in names or PLD not in names:
        raise ValueError(f"--methods must name greedy and {PLD!r} (the ratios are to them), got {spec!r}")
    return [(name, known[name]) for name in dict.fromkeys(names)]


def bench_model(model, tasks: dict[str, list[Task]], methods, *, repeats: int = 1, label: str = "workload", forward_time: bool = False,
                summary=None) -> list[dict]:
    """Times every method on every workload's requests, `repeats` times; one row per (workload,
    method), from summary(runs, method) (default: wall clock, TTFT and TPOT, wall_clock_summary).

    Before timing: one short untimed call per method (kernels compiled or loaded, torch paths
    warmed), kept out of the timings and the forward counts. No calibration: our sizers learn
    the costs from the calls' own steps, as a user's calls do (the process's first call is
    `lookahead bench --cold`'s).
    """
    dtype = str(model.dtype).removeprefix("torch.")
    first = next(t for requests in tasks.values() for t in requests)
    warm = Task(first.prompt[-64:], first.reference[:8] if first.reference is not None else None, first.eos_token_id, 8)
    for _, make in methods:
        generate_task(model, warm, make())
    runs = {name: [] for name in tasks}  # per workload, per repeat: {method: totals}
    total = repeats * sum(len(requests) for requests in tasks.values())
    with tqdm(total=total, file=sys.stderr, leave=False, unit="request") as bar:
        for repeat in range(repeats):
            for name, requests in tasks.items():
                bar.set_description(f"{dtype} {name}" + (f" run {repeat + 1}/{repeats}" if repeats > 1 else ""))
                runs[name].append(time_methods(model, requests, methods, on_request=bar.update, forward_time=forward_time,
                                                turn=repeat * len(requests)))
    rows = []
    for name, per_run in runs.items():
        for method, _ in methods:
            rows.append({label: name, "dtype": dtype, "method": method, **(summary or wall_clock_summary)(per_run, method)})
    return rows


def time_methods(model, requests: list[Task], methods, *, on_request=None, forward_time: bool = False, turn: int = 0) -> dict[str, dict]:
    """One run over `requests`: per method and request, its seconds, time to first token and
    tokens (and seconds inside the forward with forward_time); summed forward passes; whether
    every output was exact (the reference, or without one the first method's output: greedy's).
    Methods take turns on each request, so load hits all alike, and request i starts with method
    (turn + i) mod M, so a drift within a request's turns (the host warming or cooling) favours none of them."""
    options = {name: make() for name, make in methods}  # one drafter per method for all the requests
    totals = {name: dict(request_seconds=[], request_first_token_s=[], request_forward_s=[], request_forwards=[], request_tokens=[], tokens=0, forwards=0, exact=True)
              for name, _ in methods}
    names = [name for name, _ in methods]
    for i, task in enumerate(requests):
        outputs = {}
        first = (turn + i) % len(names)
        for name in names[first:] + names[:first]:
            out, timing = generate_task(model, task, options[name], forward_time=forward_time)
            outputs[name] = out
            t = totals[name]
            t["request_seconds"].append(timing.seconds)
            t["request_first_token_s"].append(timing.first_token_s)
            t["request_forward_s"].append(timing.forward_s)
            t["request_forwards"].append(timing.forwards)
            t["request_tokens"].append(len(out) - len(task.prompt))
            t["tokens"] += len(out) - len(task.prompt)
            t["forwards"] += timing.forwards
        expected = outputs[names[0]] if task.reference is None else task.prompt + task.reference
        for name, out in outputs.items():
            totals[name]["exact"] &= out == expected
        if on_request is not None:
            on_request(1)
    return totals


def generate_task(model, task: Task, options: dict, *, forward_time: bool = False) -> tuple[list[int], Timing]:
    """One generate() call of a batch-of-one task, timed (timing.timed_generate), forced in the
    forward to its reference if it has one; the output ids (prompt included) and the timing."""
    input_ids = torch.tensor([task.prompt], device=model.device)
    kwargs = dict(max_new_tokens=task.max_new_tokens, do_sample=False, **options)
    if task.eos_token_id is not None:
        kwargs["eos_token_id"] = task.eos_token_id
    kwargs["pad_token_id"] = kwargs.get("eos_token_id", 0)
    if task.reference is None:
        out, timing = timed_generate(model, input_ids, kwargs, forward_time=forward_time)
    else:
        with force_reference(model, len(task.prompt), task.reference):
            out, timing = timed_generate(model, input_ids, forced_options(kwargs), forward_time=forward_time)
    return out[0].tolist(), timing


def wall_clock_summary(per_run: list[dict[str, dict]], method: str) -> dict:
    """A method's row over the runs, from each request's fastest run (another process on the
    machine only ever adds time, and the methods take turns, so each has the same chance of a
    quiet run): tokens/s, mean time to first token, time per output token after it, and their
    ratios to greedy and to PLD k=16; with several runs, also the min and max of the ratios
    taken within one run. Ratios are speed ratios: above 1 is faster than the other method.

    ttft_ms * requests + tpot_ms * (tokens - requests) == seconds * 1000 (the times unrounded).
    """
    def fastest(runs, name):  # summed (seconds, seconds to first token) of each request's fastest run
        seconds = np.array([t[name]["request_seconds"] for t in runs])  # (runs, requests)
        first = np.array([t[name]["request_first_token_s"] for t in runs])
        pick = seconds.argmin(axis=0), np.arange(seconds.shape[1])
        return float(seconds[pick].sum()), float(first[pick].sum())

    def rates(runs, name):  # (tokens per second, tokens after the first per second of decoding)
        seconds, first = fastest(runs, name)
        tokens, requests = runs[0][name]["tokens"], len(runs[0][name]["request_seconds"])
        return tokens / seconds, ((tokens - requests) / (seconds - first) if tokens > requests else None)

    def ratios(runs):
        (wall, decode), (g_wall, g_decode), (p_wall, p_decode) = rates(runs, method), rates(runs, "greedy"), rates(runs, PLD)
        both = decode is not None and g_decode is not None and p_decode is not None
        return {"speedup": wall / g_wall, "vs_pld": wall / p_wall,
                "decode_speedup": decode / g_decode if both else None, "decode_vs_pld": decode / p_decode if both else None}

    seconds, first = fastest(per_run, method)
    tokens, requests = per_run[0][method]["tokens"], len(per_run[0][method]["request_seconds"])
    tau = [t[method]["tokens"] / t[method]["forwards"] for t in per_run]
    rounded = lambda v: None if v is None else round(v, 3)  # noqa: E731
    row = dict(tokens_per_s=round(tokens / seconds, 2), **{k: rounded(v) for k, v in ratios(per_run).items()},
               tau=round(float(np.median(tau)), 3), exact=all(t[method]["exact"] for t in per_run), tokens=tokens, requests=requests,
               seconds=seconds, ttft_ms=first / requests * 1e3,
               tpot_ms=(seconds - first) / (tokens - requests) * 1e3 if tokens > requests else None)
    if len(per_run) > 1:
        each = [ratios([t]) for t in per_run]
        for key in ("speedup", "vs_pld", "decode_speedup", "decode_vs_pld"):
            values = [r[key] for r in each if r[key] is not None]
            row[f"{key}_min"], row[f"{key}_max"] = (round(min(values), 3), round(max(values), 3)) if values else (None, None)
    return row


def measure_overhead(*, quick: bool = False) -> list[dict]:
    """µs per drafting step (extend by one verified token + propose) and index bytes per token."""
    contexts = OVERHEAD_CONTEXTS[:3] if quick else OVERHEAD_CONTEXTS
    stream = np.asarray(wl.token_stream(wl.tokenizer(), max(contexts) + 1000), dtype=np.int64)
    steps = 200
    rows = []
    for context in tqdm(contexts, desc="overhead", file=sys.stderr, leave=False):
        drafter = LookupDrafter()
        drafter.reset(stream[:context])
        start = time.perf_counter()
        for i in range(steps):
            drafter.extend(stream[context + i : context + i + 1])
            drafter.propose()
        us = (time.perf_counter() - start) / steps * 1e6
        rows.append(dict(context=context, drafter="lookahead", us_per_step=round(us, 2), bytes_per_token=round(drafter.index.nbytes / len(drafter.index), 1)))
        if context <= HF_OVERHEAD_MAX_CONTEXT:
            generator = PromptLookupCandidateGenerator(num_output_tokens=10, max_matching_ngram_size=3, max_length=10**9)
            ids = torch.from_numpy(stream[: context + steps])[None]
            hf_steps = max(5, steps // 20)
            start = time.perf_counter()
            for i in range(hf_steps):
                generator.get_candidates(ids[:, : context + i])
            us = (time.perf_counter() - start) / hf_steps * 1e6
            rows.append(dict(context=context, drafter="hf prompt lookup", us_per_step=round(us, 2), bytes_per_token=0.0))
    return rows


def measure_documents(*, quick: bool = False) -> list[dict]:
    """Model-free RAG replay: each request quotes a stdlib file that is in the library, not in its prompt.

    The prompt holds 60 tokens from inside the file; the reference output is the 256 that
    follow them. Modes: no documents; every document indexed once ("everything");
    the DocumentLibrary prefilter ("selected"). Reports τ, per-request setup, per-step
    drafting cost and the document index's memory.
    """
    bpe = wl.tokenizer()
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and 3000 <= p.stat().st_size <= 30000)
    files = files[: 150 if quick else 1500]
    docs = [np.asarray(bpe.encode(p.read_text(errors="ignore")).ids, dtype=np.int64) for p in tqdm(files, desc="tokenizing", file=sys.stderr, leave=False)]
    requests = []
    question = np.asarray(bpe.encode("Continue this code:\n").ids, dtype=np.int64)
    for doc in [d for d in docs if d.size >= 600][::20][:20]:
        requests.append(TraceRequest(np.concatenate([question, doc[200:260]]), doc[260:516], None))
    rows = []
    for mode in ("none", "everything", "selected"):
        library = DocumentLibrary(select_above_tokens=10**12 if mode == "everything" else 0)
        if mode != "none":
            for doc in docs:
                library.add(doc)
        drafter = LookupDrafter(memory=False, documents=library)
        once = time.perf_counter()
        library.store_for(requests[-1].prompt)  # one-time work: the automaton, or indexing everything
        once = time.perf_counter() - once
        setup = time.perf_counter()
        stores = [library.store_for(r.prompt) for r in requests]  # what reset does, timed alone
        setup = (time.perf_counter() - setup) / len(requests)
        index_mb = max((s.nbytes for s in stores if s is not None), default=0) / 2**20
        counts = replay_lookahead(requests, drafter, progress=f"documents {mode}")
        rows.append(dict(library_docs=len(docs), mode=mode, tau=round(counts["tokens"] / counts["steps"], 4),
                         one_time_s=round(once, 3), setup_ms_per_request=round(setup * 1e3, 3), us_per_step=round(counts["seconds"] / counts["steps"] * 1e6, 2),
                         index_mb=round(index_mb, 2)))
    return rows


def _import_pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib (pip install matplotlib)") from None
    return plt


def plot(rows: list[dict], path: Path, *, label: str = "workload") -> None:
    plt = _import_pyplot()
    group = lambda r: f"{r[label]} {r['dtype']}"  # noqa: E731
    workloads = list(dict.fromkeys(group(r) for r in rows))
    names = list(dict.fromkeys(r["method"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [next(r["speedup"] for r in rows if group(r) == w and r["method"] == name) for w in workloads]
        ax.bar(np.arange(len(workloads)) + i * width, values, width, label=name)
    ax.set_xticks(np.arange(len(workloads)) + width * (len(names) - 1) / 2, workloads)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_ylabel("speedup vs greedy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
