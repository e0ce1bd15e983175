"""`lookahead bench --context 8192,16384,32768`: long prompts (RAG), ours against prompt lookup as the context grows.

Each timed request (the first --requests of each trace file, pooled) gets C tokens of
reference material: other requests' prompts and outputs (the requests after the timed ones,
the files in turn, the last cut so the material holds exactly C tokens), in two variants:

- "prompt": the material prepended to the prompt; every method prefills it, and prompt
  lookup searches all of it at every step (its cost grows with the context, ours does not);
- "documents": the prompt as recorded; our drafters get the material as documents
  (LookupDrafter(documents=DocumentLibrary)), greedy and prompt lookup run the plain prompt.

The model is forced in the forward to each request's recorded output (traces.force_reference),
so what the material changes is drafting and its cost, never what is written. Context 0 is the
plain traces bench (one variant). Cost on a CPU: a masked prefill materialises the whole
attention matrix, so past ~4k tokens each request takes minutes here (16k at the quick shape:
about 8 minutes per request for the four methods, under load); 8k-32k is a GPU workload.
"""


import numpy as np
import torch

import lookahead
from lookahead import DocumentLibrary, LookupDrafter
from lookahead.bench.e2e import PLD, bench_model, methods, spread
from lookahead.bench.replay import TRACE_VOCAB_SIZE
from lookahead.bench.tables import format_table, json_report
from lookahead.bench.traces import (
    Task, build_model, describe, forced_trace_task, parse_dtypes, parse_sizes, read_traces, shape_for, trace_paths,
)

VARIANTS = ("prompt", "documents")



def material_pool(per_file: dict, skip: int) -> list[list[int]]:
    """Prompt + output of every request after the first `skip` of each file, the files in turn."""
    rest = [requests[skip:] for requests in per_file.values()]
    pool = []
    for i in range(max((len(r) for r in rest), default=0)):
        pool += [r[i].prompt.tolist() + r[i].output.tolist() for r in rest if i < len(r)]
    return pool


def material(pool: list[list[int]], tokens: int) -> list[list[int]]:
    """The pool's first entries holding exactly `tokens` tokens (the last one cut)."""
    out, left = [], tokens
    for entry in pool:
        if left == 0:
            break
        out.append(entry[:left])
        left -= len(out[-1])
    if left:
        raise ValueError(f"--context {tokens} needs {tokens} tokens of other requests; the trace files hold {tokens - left}")
    return out


def context_methods(documents: list[list[int]] | None):
    """methods(), ours given `documents` (a fresh library per workload, like their drafters) unless None."""
    if documents is None:
        return methods()

    def drafter():
        library = DocumentLibrary()
        for document in documents:
            library.add(np.asarray(document, dtype=np.int64))
        return LookupDrafter(documents=library)

    ours = {"lookahead assistant_model": lambda: dict(assistant_model=drafter()),
            "lookahead.generate": lambda: dict(custom_generate=lookahead.generate, assistant=drafter())}
    return [(name, ours.get(name, make)) for name, make in methods()]


def run_long_context(args) -> int:
    """Runs `lookahead bench --context`; 0 when every output is exact (or there are no traces: skipped)."""
    contexts = parse_sizes(args.context, option="--context", least=0, example="8192,16384,32768")
    paths = trace_paths(args, "--context")
    if not paths:
        return 0
    vocab = TRACE_VOCAB_SIZE if args.vocab_size is None else args.vocab_size
    per_file = read_traces(list(paths), None, vocab)
    timed = [forced_trace_task(r, args.max_new_tokens) for requests in per_file.values() for r in requests[: args.requests]]
    pool = material_pool(per_file, args.requests)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows, described = [], None
    for dtype in parse_dtypes(args.dtype, device=device, traces=True):
        model = build_model(shape=shape_for(args, default="quick"), vocab=vocab, dtype=dtype, device=device)
        described = described or describe(model)
        for context in contexts:
            docs = material(pool, context)
            prefix = [token for entry in docs for token in entry]
            for variant in VARIANTS[: 1 if context == 0 else 2]:
                tasks = timed if variant == "documents" else [Task(prefix + t.prompt, t.reference, t.eos_token_id, t.max_new_tokens) for t in timed]
                chosen = context_methods(docs if variant == "documents" else None)
                for row in bench_model(model, {"all": tasks}, chosen, repeats=args.repeats):
                    del row["workload"]
                    rows.append(dict(context=context, variant=variant, **row))
        del model
    if not json_report(args, {"device": device, "model": described, "contexts": contexts, "requests": len(timed),
                              "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "results": rows}):
        print(f"model: {described}, {device}; the first {args.requests} request(s) of {', '.join(p.name for p in paths)}, at most "
              f"{args.max_new_tokens} new tokens each; context: tokens of other requests' prompts and outputs, prepended to the prompt "
              "(prompt) or given to our drafters as documents (documents: the prompt as recorded)")
        print(f"TTFT: mean time to first token; TPOT: time per output token after it; vs PLD: speed over {PLD}, wall clock and TPOT, same run")
        print(format_table(
            ["context", "variant", "dtype", "method", "tokens/s", "vs PLD k=16", "TTFT ms", "TPOT ms", "TPOT vs PLD", "tau", "exact"],
            [[r["context"], r["variant"], r["dtype"], r["method"], f"{r['tokens_per_s']:.1f}", spread(r, "vs_pld"), f"{r['ttft_ms']:.1f}",
              "-" if r["tpot_ms"] is None else f"{r['tpot_ms']:.2f}", spread(r, "decode_vs_pld"), f"{r['tau']:.2f}", "yes" if r["exact"] else "NO"]
             for r in rows],
        ))
    return 0 if all(r["exact"] for r in rows) else 1
