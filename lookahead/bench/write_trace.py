"""`lookahead bench --write-trace`: a trace with the model's top-k at every position, from a real model.

Each request: the prompt (a story opening, blend.STORY_OPENINGS, or a line of --prompts),
the model's greedy output (`model.generate(do_sample=False)`), and `topk_token_ids` from one
plain forward over prompt + output: row i, the k ids with the highest logits after token i
(the format: docs/traces.md). `lookahead replay` then replays lookup, the
prediction table and their blend on it without the model.
"""

import json
import sys
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

from lookahead.bench.blend import STORY_OPENINGS, prompt_ids
from lookahead.bench.traces import load_model, parse_dtypes
from lookahead.predictions import DEFAULT_TOP_K


def trace_row(model, prompt: torch.Tensor, *, max_new_tokens: int, k: int = DEFAULT_TOP_K) -> dict:
    """One request's trace row: (1, prompt_len) ids in; prompt, greedy output and (prompt_len + output_len, k) top-k ids out."""
    with torch.inference_mode():
        sequence = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=max_new_tokens)
        logits = model(input_ids=sequence).logits[0]  # (prompt_len + output_len, vocab)
        topk = logits.topk(min(k, logits.shape[-1]), dim=-1).indices  # likeliest first
    ids = sequence[0].tolist()
    return dict(prompt_token_ids=ids[: prompt.shape[1]], generated_token_ids=ids[prompt.shape[1] :], topk_token_ids=topk.tolist())


def top1_disagreements(row: dict) -> int:
    """Output positions whose token is not the first id of the top-k row before it (0 where the forward
    over the whole sequence ranks exactly as generate's steps chose)."""
    start = len(row["prompt_token_ids"]) - 1
    return sum(row["topk_token_ids"][start + j][0] != token for j, token in enumerate(row["generated_token_ids"]))


def run_write_trace(args) -> int:
    if not args.model:
        raise ValueError("--write-trace runs a real model: give --model (e.g. ../shared/models/stories260K)")
    out = Path(args.write_trace)
    if not out.parent.is_dir():
        raise ValueError(f"--write-trace {out}: no folder {out.parent}")
    tokenizer = load_model(transformers.AutoTokenizer, args.model)
    if args.prompts:
        texts = [line for line in args.prompts.read_text().splitlines() if line.strip()][: args.requests]
    else:
        texts = STORY_OPENINGS[: args.requests]
    dtypes = parse_dtypes(args.dtype or "float32", device="cpu", traces=False)
    if len(dtypes) > 1:
        raise ValueError(f"--write-trace takes one --dtype, got {args.dtype!r}")
    model = load_model(transformers.AutoModelForCausalLM, args.model, dtype=dtypes[0]).eval()
    disagreements = tokens = 0
    with out.open("w") as f:
        for i, prompt in enumerate(tqdm(prompt_ids(tokenizer, texts), desc="write-trace", file=sys.stderr)):
            row = dict(id=str(i), **trace_row(model, prompt, max_new_tokens=args.max_new_tokens))
            disagreements += top1_disagreements(row)
            tokens += len(row["generated_token_ids"])
            f.write(json.dumps(row) + "\n")
    report = dict(file=str(out), model=args.model, requests=len(texts), tokens=tokens, top1_disagreements=disagreements)
    print(json.dumps(report) if args.json else f"wrote {out}: {len(texts)} requests, {tokens} output tokens, "
          f"{disagreements} where the top-1 is not the greedy token")
    return 0
