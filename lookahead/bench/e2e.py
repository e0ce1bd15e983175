"""`lookahead bench`: real generate() calls, side by side in one run, outputs compared token for token.

Methods (`methods`): plain greedy, transformers' prompt lookup (k=16, ngram 3), ours through
`assistant_model=LookupDrafter()` and through `lookahead.generate`, defaults; `--variants`
adds more. Each takes its turn on every request (`time_methods`, the one timing loop), one
drafter per method serving all of a workload's requests. Default model: random weights with
a 0.5B shape, its greedy choice forced to the workload's reference (workloads.FollowReference):
the built-in workloads, or `--traces` (recorded outputs, at the traces' real vocabulary).
`--model` runs a real model instead. `--overhead` measures per-step drafting cost and index
memory against context length; `--documents`, drafting from a document library.
"""

import json
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

import lookahead
from lookahead import LookupDrafter
from lookahead.bench import workloads as wl
from lookahead.bench.tables import format_table

# A 0.5B-class decoder (Qwen2-0.5B's shape), vocab set by the tokenizer.
DEFAULT_SHAPE = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2)
# --quick: a 60M-parameter shape, so prefilling a 1,200-token file takes a second, not twelve.
QUICK_SHAPE = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2)
OVERHEAD_CONTEXTS = [1_000, 8_000, 32_000, 128_000, 1_000_000]
HF_OVERHEAD_MAX_CONTEXT = 128_000
TRACE_VOCAB_SIZE = 128_256  # Llama-3's tokenizer, which wrote ../shared/traces
DEFAULT_MAX_NEW_TOKENS = 256  # without --max-new-tokens
DEFAULT_BATCH_MAX_NEW_TOKENS = 64  # --batch without --max-new-tokens: a small default run


def add_bench_arguments(parser) -> None:
    parser.add_argument("--model", default=None, help="hub name or local folder of a causal LM (default: random weights, forced)")
    parser.add_argument("--prompts", type=Path, default=None, help="JSON lines with a 'prompt' text each (with --model)")
    parser.add_argument("--traces", type=Path, nargs="+", default=None,
                        help="recorded trace files (prompt/generated token ids, see lookahead/bench/replay.py) instead of built-in workloads")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help=f"vocabulary of the forced model with --traces (default {TRACE_VOCAB_SIZE}, Llama-3's); every trace id must be below it")
    parser.add_argument("--requests", type=int, default=3, help="requests per workload: the first N of each trace file")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help=f"most tokens per request (a trace's recorded output is cut there; default {DEFAULT_MAX_NEW_TOKENS}, "
                             f"{DEFAULT_BATCH_MAX_NEW_TOKENS} with --batch)")
    parser.add_argument("--dtype", default=None,
                        help="float32, bfloat16, auto (bfloat16 on CUDA, float32 on CPU) or a comma list, e.g. float32,bfloat16: "
                             "one model per dtype, each timed (default: float32,bfloat16 with --traces, else auto)")
    parser.add_argument("--repeats", type=int, default=1, help="run everything N times; report each request's fastest run, and the min-max of the runs' ratios")
    parser.add_argument("--variants", action="store_true",
                        help="also time prompt lookup k=10, our chain-only and tree-only engine, and our unsized drafts")
    parser.add_argument("--quick", action="store_true", help="1 request per workload, 128 new tokens, a 60M model")
    parser.add_argument("--overhead", action="store_true", help="per-step drafting cost and bytes per token vs context length")
    parser.add_argument("--documents", action="store_true", help="RAG-style drafting from a document library: prefiltered vs indexing everything")
    parser.add_argument("--batch", default=None,
                        help="batch sizes, e.g. 1,4,16: plain batched greedy vs lookahead.generate on one left-padded batch of trace "
                             "requests per size (--traces, default ../shared/traces; skipped where absent)")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="with --batch: each prompt's last N tokens (default 256)")
    parser.add_argument("--json", action="store_true", help="print one JSON object and nothing else on stdout")
    parser.add_argument("--plot", type=Path, default=None, help="write a chart of speedup per workload and method")


def run_bench(args) -> int:
    if args.max_new_tokens is None:
        args.max_new_tokens = DEFAULT_BATCH_MAX_NEW_TOKENS if args.batch is not None else DEFAULT_MAX_NEW_TOKENS
    if args.requests < 1 or args.max_new_tokens < 1:  # before --quick sets its own
        raise ValueError(f"--requests and --max-new-tokens must be >= 1, got {args.requests} and {args.max_new_tokens}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.prompt_tokens is not None and (args.batch is None or args.prompt_tokens < 1):
        raise ValueError(f"--prompt-tokens cuts the prompts of --batch, and must be >= 1, got {args.prompt_tokens}")
    if args.batch is not None:
        if args.model or args.prompts or args.overhead or args.documents:
            raise ValueError("--batch runs the forced model on trace requests: it does not take --model, --prompts, --overhead or --documents")
        from lookahead.bench.batched import run_batch_bench

        return run_batch_bench(args)
    if args.plot:
        _import_pyplot()  # up front, not after the whole benchmark has run
    if args.overhead:
        rows = measure_overhead(quick=args.quick)
        if args.json:
            print(json.dumps({"overhead": rows}))
        else:
            print(format_table(["context", "drafter", "us/step", "bytes/token"], [[r["context"], r["drafter"], r["us_per_step"], r["bytes_per_token"]] for r in rows]))
        return 0
    if args.documents:
        rows = measure_documents(quick=args.quick)
        if args.json:
            print(json.dumps({"documents": rows}))
        else:
            print(format_table(
                ["documents", "mode", "tau", "one-time s", "setup ms/request", "us/step", "index MB"],
                [[r["library_docs"], r["mode"], f"{r['tau']:.3f}", f"{r['one_time_s']:.2f}", f"{r['setup_ms_per_request']:.2f}", f"{r['us_per_step']:.1f}", f"{r['index_mb']:.1f}"] for r in rows],
            ))
        return 0
    if args.quick:
        args.requests, args.max_new_tokens = 1, 128
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = parse_dtypes(args.dtype, device=device, traces=bool(args.traces))
    tasks, vocab = load_tasks(args)
    label = "file" if args.traces else "workload"
    rows, described = [], None
    for dtype in dtypes:
        model = build_model(args, dtype, device, vocab)
        described = described or _describe(model, args)
        rows += bench_model(model, tasks, methods(variants=args.variants), repeats=args.repeats, label=label)
        del model
    if args.json:
        print(json.dumps({"device": device, "model": described, "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
                          "requests": args.requests, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "results": rows}))
    else:
        print(f"model: {described}, {device}; {args.requests} request(s) per {label}, at most {args.max_new_tokens} new tokens each")
        print("tokens/s: generated tokens / wall time of whole generate() calls (prefill included, as a user sees it); "
              f"speedup: over greedy, vs PLD: over {PLD}, both from the same run"
              + (f" (each request's fastest of {args.repeats} runs; in brackets the min-max of the runs' own ratios)" if args.repeats > 1 else "")
              + "; tau: generated tokens / forward passes of the target; exact: output equal to "
              + ("plain greedy's" if args.model else "the reference"))
        spread = lambda r, key: f"{r[key]:.2f}x" + (f" ({r[key + '_min']:.2f}-{r[key + '_max']:.2f})" if args.repeats > 1 else "")  # noqa: E731
        print(format_table(
            [label, "dtype", "method", "tokens/s", "speedup", "vs PLD k=16", "tau", "exact"],
            [[r[label], r["dtype"], r["method"], f"{r['tokens_per_s']:.1f}", spread(r, "speedup"), spread(r, "vs_pld"), f"{r['tau']:.2f}",
              "yes" if r["exact"] else "NO"] for r in rows],
        ))
    if args.plot:
        plot(rows, args.plot, label=label)
    return 0 if all(r["exact"] for r in rows) else 1


@dataclass(frozen=True)
class Task:
    """One request: the prompt and, for the forced model, the output it is made to write."""

    prompt: list[int]
    reference: list[int] | None  # None: a real model writes what it writes
    eos_token_id: int | None  # None: the model's own
    max_new_tokens: int  # len(reference) when forced


def parse_dtypes(spec: str | None, *, device: str, traces: bool) -> list[torch.dtype]:
    """--dtype: float32, bfloat16, auto, or a comma list of them; duplicates dropped, order kept."""
    if spec is None:
        spec = "float32,bfloat16" if traces else "auto"
    dtypes = []
    for name in (s.strip() for s in spec.split(",")):
        if name == "auto":
            # Measured on this project's CPU (AVX-512 without bf16 units): fp32 verifies 16
            # tokens for 2.5x one token's cost, bf16 for 4.4x. GPUs are the other way round.
            name = "bfloat16" if device == "cuda" else "float32"
        if name not in ("float32", "bfloat16"):
            raise ValueError(f"--dtype takes float32, bfloat16, auto or a comma list of them, got {spec!r}")
        if getattr(torch, name) not in dtypes:
            dtypes.append(getattr(torch, name))
    return dtypes


def load_tasks(args) -> tuple[dict[str, list[Task]], int | None]:
    """Per workload (or trace file), its requests; and the forced model's vocabulary (None with --model)."""
    if args.vocab_size is not None and (args.model or not args.traces):
        raise ValueError("--vocab-size sets the forced model's vocabulary with --traces (the built-in workloads and --model bring their own)")
    if args.model:
        import transformers

        if args.traces:
            return {name: [Task(r.prompt.tolist(), None, None, args.max_new_tokens) for r in requests]
                    for name, requests in _read_traces(args.traces, args.requests, None).items()}, None
        tokenizer = _load(transformers.AutoTokenizer, args.model)
        if args.prompts:
            texts = {args.prompts.name: [_read_prompt(args.prompts, i, line) for i, line in enumerate(args.prompts.read_text().splitlines(), 1) if line.strip()][: args.requests]}
        else:
            texts = {name: [p for p, _ in pairs] for name, pairs in wl.make_workloads(requests=args.requests).items()}
        return {name: [Task(_chat_ids(tokenizer, p), None, None, args.max_new_tokens) for p in prompts] for name, prompts in texts.items()}, None
    if args.prompts:
        raise ValueError("--prompts needs --model: the forced default model writes the built-in references")
    if args.traces:
        vocab = TRACE_VOCAB_SIZE if args.vocab_size is None else args.vocab_size
        if vocab < 2:
            raise ValueError(f"--vocab-size must be >= 2, got {vocab}")
        return {name: [_forced_trace_task(r, args.max_new_tokens) for r in requests]
                for name, requests in _read_traces(args.traces, args.requests, vocab).items()}, vocab
    bpe = wl.tokenizer()
    pairs = wl.make_workloads(requests=args.requests)
    eos = bpe.token_to_id(wl.EOS)
    return {name: [Task(r.prompt, r.reference, eos, len(r.reference)) for r in wl.encode(bpe, p, args.max_new_tokens)] for name, p in pairs.items()}, wl.VOCAB_SIZE


def _read_traces(paths: list[Path], requests: int, vocab: int | None) -> dict:
    """The first `requests` requests of each file, by file name (the path where names repeat)."""
    from lookahead.bench.replay import load_trace

    names = [p.name for p in paths]
    out = {}
    for path in paths:
        name = path.name if names.count(path.name) == 1 else str(path)
        loaded = load_trace(path)
        if vocab is not None:
            for i, r in enumerate(loaded, 1):
                top = max(int(r.prompt.max(initial=0)), int(r.output.max(initial=0)))
                if top >= vocab:
                    raise ValueError(f"{path}: request {i} holds token id {top}, not below --vocab-size {vocab}")
        out[name] = loaded[:requests]
    return out


def _forced_trace_task(request, max_new_tokens: int) -> Task:
    """The recorded output cut to max_new_tokens; EOS is the recorded output's last token (the
    model's end-of-turn where it finished), so the forced model stops there as the real one
    did, or at the cut, never earlier."""
    output = request.output.tolist()
    eos = output[-1] if output else None
    reference = output[:max_new_tokens]
    if eos in reference:
        reference = reference[: reference.index(eos) + 1]
    return Task(request.prompt.tolist(), reference, eos, len(reference))


def _load(auto_class, name: str, **kwargs):
    """auto_class.from_pretrained(name); a model that cannot be loaded is one line, not transformers' traceback."""
    try:
        return auto_class.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as e:  # not found, not a model, offline
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"--model {name}: cannot load it ({reason})") from None


def build_model(args, dtype: torch.dtype, device: str, vocab: int | None):
    """The model timed: --model's, or random weights with DEFAULT_SHAPE (QUICK_SHAPE with --quick) at `vocab`."""
    import transformers

    if args.model:
        return _load(transformers.AutoModelForCausalLM, args.model, dtype=dtype).to(device).eval()
    torch.manual_seed(0)
    shape = QUICK_SHAPE if args.quick else DEFAULT_SHAPE
    config = transformers.Qwen2Config(vocab_size=vocab, tie_word_embeddings=True, **shape)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()


def _describe(model, args) -> str:
    if args.model:
        return args.model
    params = sum(p.numel() for p in model.parameters())
    return f"random {type(model).__name__} ({params / 1e6:.0f}M parameters, vocab {model.config.vocab_size}), forced to the references"


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


PLD = "hf prompt lookup k=16"


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
        ("lookahead assistant_model unsized k=16", lambda: dict(assistant_model=unsized(num_draft_tokens=16))),
        ("lookahead.generate chain unsized k=16", lambda: engine(assistant=unsized(num_draft_tokens=16), tree=False)),
        ("lookahead.generate tree unsized 32 nodes", lambda: engine(assistant=unsized(), tree=True, max_tree_nodes=32)),
    ]


def bench_model(model, tasks: dict[str, list[Task]], methods, *, repeats: int = 1, label: str = "workload") -> list[dict]:
    """Times every method on every workload's requests, `repeats` times; one row per (workload, method).

    Before timing: the engine's one-time cost calibration (lookahead.verify_costs) and one
    short untimed call per method (kernels compiled or loaded, torch paths warmed), kept out
    of the timings and the forward counts.
    """
    dtype = str(model.dtype).removeprefix("torch.")
    lookahead.verify_costs(model)
    first = next(t for requests in tasks.values() for t in requests)
    warm = Task(first.prompt[-64:], first.reference[:8] if first.reference is not None else None, first.eos_token_id, 8)
    for _, make in methods:
        _generate(model, warm, make())
    runs = {name: [] for name in tasks}  # per workload, per repeat: {method: totals}
    total = repeats * sum(len(requests) for requests in tasks.values())
    with tqdm(total=total, file=sys.stderr, leave=False, unit="request") as bar:
        for repeat in range(repeats):
            for name, requests in tasks.items():
                bar.set_description(f"{dtype} {name}" + (f" run {repeat + 1}/{repeats}" if repeats > 1 else ""))
                runs[name].append(time_methods(model, requests, methods, on_request=bar.update))
    rows = []
    for name, per_run in runs.items():
        for method, _ in methods:
            rows.append({label: name, "dtype": dtype, "method": method, **_summary(per_run, method)})
    return rows


def time_methods(model, requests: list[Task], methods, *, on_request=None) -> dict[str, dict]:
    """One run over `requests`: per method, the seconds of each request, summed tokens and
    forward passes, and whether every output was exact. Methods take turns on each request, so load hits all alike."""
    options = {name: make() for name, make in methods}  # one drafter per method for all the requests
    totals = {name: dict(request_seconds=[], tokens=0, forwards=0, exact=True) for name, _ in methods}
    for task in requests:
        expected = None if task.reference is None else task.prompt + task.reference
        for name, _ in methods:
            out, seconds, forwards = _generate(model, task, options[name])
            expected = out if expected is None else expected  # no reference: the first method's (greedy) output
            t = totals[name]
            t["request_seconds"].append(seconds)
            t["tokens"] += len(out) - len(task.prompt)
            t["forwards"] += forwards
            t["exact"] &= out == expected
        if on_request is not None:
            on_request(1)
    return totals


def _generate(model, task: Task, options: dict) -> tuple[list[int], float, int]:
    """One generate() call, timed whole (prefill included); the output ids, its seconds and forward passes."""
    from transformers import LogitsProcessorList

    input_ids = torch.tensor([task.prompt], device=model.device)
    kwargs = dict(max_new_tokens=task.max_new_tokens, do_sample=False, **options)
    if task.reference is not None:
        kwargs["logits_processor"] = LogitsProcessorList([wl.FollowReference(len(task.prompt), task.reference)])
    if task.eos_token_id is not None:
        kwargs["eos_token_id"] = task.eos_token_id
    kwargs["pad_token_id"] = kwargs.get("eos_token_id", 0)
    out, seconds, forwards = timed_generate(model, input_ids, kwargs)
    return out[0].tolist(), seconds, forwards


def timed_generate(model, input_ids: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, float, int]:
    """model.generate(input_ids, **kwargs), its wall time (the device synchronised either side) and the
    target's forward passes."""
    forwards = [0]
    hook = model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    try:
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids, **kwargs)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    finally:
        hook.remove()
    return out, seconds, forwards[0]


def _summary(per_run: list[dict[str, dict]], method: str) -> dict:
    """A method's row over the runs: tokens/s and its ratios to greedy and to PLD k=16 from
    each request's fastest run (another process on the machine only ever adds time, and the
    methods take turns, so each has the same chance of a quiet run); with several runs, also
    the min and max of the ratios taken within one run."""
    def speed(runs, name):
        fastest = np.min([t[name]["request_seconds"] for t in runs], axis=0)  # per request, over the runs
        return runs[0][name]["tokens"] / float(fastest.sum())

    ratios = lambda runs: {"speedup": speed(runs, method) / speed(runs, "greedy"), "vs_pld": speed(runs, method) / speed(runs, PLD)}  # noqa: E731
    tau = [t[method]["tokens"] / t[method]["forwards"] for t in per_run]
    row = dict(tokens_per_s=round(speed(per_run, method), 2), **{k: round(v, 3) for k, v in ratios(per_run).items()},
               tau=round(float(np.median(tau)), 3), exact=all(t[method]["exact"] for t in per_run), tokens=per_run[0][method]["tokens"])
    if len(per_run) > 1:
        each = [ratios([t]) for t in per_run]
        for key in ("speedup", "vs_pld"):
            row[f"{key}_min"], row[f"{key}_max"] = round(min(r[key] for r in each), 3), round(max(r[key] for r in each), 3)
    return row


def measure_overhead(*, quick: bool = False) -> list[dict]:
    """µs per drafting step (extend by one verified token + propose) and index bytes per token."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

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
    from lookahead import DocumentLibrary
    from lookahead.bench.replay import TraceRequest, replay_lookahead

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
