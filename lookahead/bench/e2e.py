"""`lookahead bench`: real generate() calls, side by side in one run, outputs compared token for token.

Methods: plain greedy, transformers' prompt lookup (k=10 and k=16, ngram 3) and ours.
Default model: random weights with a small LLM's shape, its greedy choice forced to the
workload's reference (see workloads.FollowReference). `--model` runs a real model instead.
`--overhead` measures per-step drafting cost and index memory against context length.
"""

import json
import sys
import sysconfig
import time
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


def add_bench_arguments(parser) -> None:
    parser.add_argument("--model", default=None, help="hub name or local folder of a causal LM (default: random weights, forced)")
    parser.add_argument("--prompts", type=Path, default=None, help="JSON lines with a 'prompt' text each (with --model)")
    parser.add_argument("--traces", type=Path, default=None, help="recorded traces (prompt/generated token ids) instead of built-in workloads")
    parser.add_argument("--requests", type=int, default=3, help="requests per workload")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto", help="auto: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--quick", action="store_true", help="1 request per workload, 128 new tokens, a 60M model")
    parser.add_argument("--overhead", action="store_true", help="per-step drafting cost and bytes per token vs context length")
    parser.add_argument("--documents", action="store_true", help="RAG-style drafting from a document library: prefiltered vs indexing everything")
    parser.add_argument("--json", action="store_true", help="print one JSON object and nothing else on stdout")
    parser.add_argument("--plot", type=Path, default=None, help="write a chart of speedup per workload and method")


def run_bench(args) -> int:
    if args.requests < 1 or args.max_new_tokens < 1:  # before --quick sets its own
        raise ValueError(f"--requests and --max-new-tokens must be >= 1, got {args.requests} and {args.max_new_tokens}")
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
    model, tasks = load_model_and_tasks(args)
    rows = []
    for workload, requests in tasks.items():
        rows += bench_workload(model, workload, requests, args.max_new_tokens)
    if args.json:
        print(json.dumps({"device": str(model.device), "dtype": str(model.dtype), "results": rows}))
    else:
        print(f"model: {getattr(model.config, '_name_or_path', '') or 'random ' + type(model).__name__}, {model.dtype}, {model.device}")
        print(format_table(
            ["workload", "method", "tokens/s", "speedup", "tau", "exact"],
            [[r["workload"], r["method"], f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}x", f"{r['tau']:.2f}", "yes" if r["exact"] else "NO"] for r in rows],
        ))
    if args.plot:
        plot(rows, args.plot)
    return 0 if all(r["exact"] for r in rows) else 1


def _dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        # Measured on this project's CPU (AVX-512 without bf16 units): fp32 verifies 16
        # tokens for 2.5x one token's cost, bf16 for 4.4x. GPUs are the other way round.
        return torch.bfloat16 if device == "cuda" else torch.float32
    return getattr(torch, name)


def load_model_and_tasks(args):
    """The model and, per workload, a list of (prompt ids, forced reference ids or None)."""
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = _dtype(args.dtype, device)
    if args.model:
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
            model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
        except (OSError, ValueError) as e:  # not found, not a model, offline: one line, not transformers' traceback
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"--model {args.model}: cannot load it ({reason})") from None
        if args.traces:
            return model, {args.traces.name: _trace_tasks(args.traces, args.requests, args.max_new_tokens, forced=False)}
        if args.prompts:
            texts = {args.prompts.name: [(_read_prompt(args.prompts, i, line), None) for i, line in enumerate(args.prompts.read_text().splitlines(), 1) if line.strip()][: args.requests]}
        else:
            texts = {name: [(p, None) for p, _ in pairs] for name, pairs in wl.make_workloads(requests=args.requests).items()}
        return model, {name: [(_chat_ids(tokenizer, p), None) for p, _ in pairs] for name, pairs in texts.items()}
    if args.prompts:
        raise ValueError("--prompts needs --model: the forced default model writes the built-in references")
    if args.traces:
        tasks = {args.traces.name: _trace_tasks(args.traces, args.requests, args.max_new_tokens, forced=True)}
        vocab = 1 + max(max(max(p), max(r)) for reqs in tasks.values() for p, r in reqs)
    else:
        bpe = wl.tokenizer()
        pairs = wl.make_workloads(requests=args.requests)
        tasks = {name: [(r.prompt, r.reference) for r in wl.encode(bpe, p, args.max_new_tokens)] for name, p in pairs.items()}
        vocab = wl.VOCAB_SIZE
    torch.manual_seed(0)
    shape = QUICK_SHAPE if args.quick else DEFAULT_SHAPE
    config = transformers.Qwen2Config(vocab_size=vocab, tie_word_embeddings=True, **shape)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()
    return model, tasks


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


def _trace_tasks(path: Path, requests: int, max_new_tokens: int, forced: bool):
    from lookahead.bench.replay import load_trace

    return [
        (r.prompt.tolist(), r.output[:max_new_tokens].tolist() if forced else None)
        for r in load_trace(path)[:requests]
    ]


def methods():
    """(name, generate() options) of every method compared; built fresh per request."""
    return [
        ("greedy", lambda: {}),
        ("hf prompt lookup k=10", lambda: dict(prompt_lookup_num_tokens=10, max_matching_ngram_size=3)),
        ("hf prompt lookup k=16", lambda: dict(prompt_lookup_num_tokens=16, max_matching_ngram_size=3)),
        ("lookahead (transformers loop)", lambda: dict(assistant_model=LookupDrafter())),
        ("lookahead engine, chain", lambda: dict(custom_generate=lookahead.generate, assistant=LookupDrafter(), tree=False)),
        ("lookahead engine, tree", lambda: dict(custom_generate=lookahead.generate, assistant=LookupDrafter(), tree=True)),
    ]


def bench_workload(model, workload: str, requests, max_new_tokens: int) -> list[dict]:
    lookahead.verify_costs(model)  # the engine's one-time calibration, kept out of the timings and forward counts
    forward_calls = [0]
    hook = model.register_forward_pre_hook(lambda *_: forward_calls.__setitem__(0, forward_calls[0] + 1))
    from transformers import LogitsProcessorList

    totals = {name: dict(seconds=0.0, tokens=0, forwards=0, exact=True) for name, _ in methods()}
    try:
        for prompt, reference in tqdm(requests, desc=workload, file=sys.stderr, leave=False):
            input_ids = torch.tensor([prompt], device=model.device)
            budget = len(reference) if reference is not None else max_new_tokens
            expected = None
            for name, options in methods():
                kwargs = dict(max_new_tokens=budget, do_sample=False, **options())
                if reference is not None:
                    kwargs["logits_processor"] = LogitsProcessorList([wl.FollowReference(len(prompt), reference)])
                    kwargs["eos_token_id"] = reference[-1]
                kwargs["pad_token_id"] = kwargs.get("eos_token_id", 0)
                forward_calls[0] = 0
                if model.device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                with torch.inference_mode():
                    out = model.generate(input_ids, **kwargs)
                if model.device.type == "cuda":
                    torch.cuda.synchronize()
                t = totals[name]
                t["seconds"] += time.perf_counter() - start
                t["tokens"] += out.shape[1] - input_ids.shape[1]
                t["forwards"] += forward_calls[0]
                expected = out if expected is None else expected
                t["exact"] &= out.tolist() == expected.tolist()
    finally:
        hook.remove()
    base = totals["greedy"]["tokens"] / totals["greedy"]["seconds"]
    rows = []
    for name, t in totals.items():
        speed = t["tokens"] / t["seconds"]
        rows.append(dict(workload=workload, method=name, tokens_per_s=round(speed, 2), speedup=round(speed / base, 3),
                         tau=round(t["tokens"] / t["forwards"], 3), exact=t["exact"], tokens=t["tokens"]))
    return rows


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
    from lookahead.bench.replay import Request, replay_lookahead

    bpe = wl.tokenizer()
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and 3000 <= p.stat().st_size <= 30000)
    files = files[: 150 if quick else 1500]
    docs = [np.asarray(bpe.encode(p.read_text(errors="ignore")).ids, dtype=np.int64) for p in tqdm(files, desc="tokenizing", file=sys.stderr, leave=False)]
    requests = []
    question = np.asarray(bpe.encode("Continue this code:\n").ids, dtype=np.int64)
    for doc in [d for d in docs if d.size >= 600][::20][:20]:
        requests.append(Request(np.concatenate([question, doc[200:260]]), doc[260:516], None))
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


def plot(rows: list[dict], path: Path) -> None:
    plt = _import_pyplot()
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    names = list(dict.fromkeys(r["method"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [next(r["speedup"] for r in rows if r["workload"] == w and r["method"] == name) for w in workloads]
        ax.bar(np.arange(len(workloads)) + i * width, values, width, label=name)
    ax.set_xticks(np.arange(len(workloads)) + width * (len(names) - 1) / 2, workloads)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_ylabel("speedup vs greedy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
