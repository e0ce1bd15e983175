"""`lookahead bench --batch 1,4,16`: plain batched greedy against `lookahead.generate` on one batch per size.

The forced model of `--traces` (random weights, the bench's shape, the traces' real
vocabulary), whose greedy choice follows each row's recorded output (`FollowRows`). Per
batch size b: the first b requests, taken from the trace files in turn, left-padded into one
batch; each method runs the batch once, timed whole (prefill included); ours must equal
plain batched greedy token for token. Both dtypes by default, as `--traces`.
"""

import sys

import torch
from tqdm import tqdm
from transformers import LogitsProcessor, LogitsProcessorList

import lookahead
from lookahead import LookupDrafter
from lookahead.bench.e2e import PLD, methods
from lookahead.bench.replay import TRACE_VOCAB_SIZE
from lookahead.bench.tables import format_table, json_report
from lookahead.bench.timing import Timing, timed_generate
from lookahead.bench.traces import (
    Task, build_model, describe, force_reference, forced_options, forced_trace_task, parse_dtypes, parse_sizes, read_traces, shape_for, trace_paths,
)

DEFAULT_PROMPT_TOKENS = 256  # --batch without --prompt-tokens: each prompt's last 256 tokens


class FollowRows(LogitsProcessor):
    """Makes each row's reference token the argmax, the row known by its padded prompt.

    Plain batched generate calls it with every row, our engine with one row at a time; a
    row's first prompt_len ids (its left padding and prompt) say which reference it follows.
    """

    def __init__(self, prompts: torch.Tensor, references: list[list[int]]):
        self.prompts = prompts  # (rows, prompt_len), left-padded
        self.references = references

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        width = self.prompts.shape[1]
        t = input_ids.shape[1] - width
        rows = (input_ids[:, None, :width] == self.prompts[None].to(input_ids.device)).all(-1).int().argmax(-1).tolist()
        for i, row in enumerate(rows):
            reference = self.references[row]
            if 0 <= t < len(reference):
                scores[i, reference[t]] = scores[i].max() + 1.0
        return scores


def run_batch_bench(args) -> int:
    """Runs `lookahead bench --batch`; 0 when every batch is exact (or there are no traces: skipped)."""
    sizes = parse_sizes(args.batch, option="--batch", least=1, example="1,4,16")
    paths = trace_paths(args, "--batch")
    if not paths:
        return 0
    max_new = args.max_new_tokens
    prompt_tokens = args.prompt_tokens or DEFAULT_PROMPT_TOKENS
    vocab = TRACE_VOCAB_SIZE if args.vocab_size is None else args.vocab_size
    per_file = read_traces(list(paths), max(sizes), vocab)
    pooled = [request for group in zip(*per_file.values()) for request in group]  # the files in turn
    pooled += [r for requests in per_file.values() for r in requests[len(pooled) // len(per_file) :]]
    if len(pooled) < max(sizes):
        raise ValueError(f"--batch {max(sizes)} needs {max(sizes)} requests; the trace files hold {len(pooled)}")
    tasks = [forced_trace_task(r, max_new) for r in pooled]
    tasks = [Task(t.prompt[-prompt_tokens:], t.reference, t.eos_token_id, t.max_new_tokens) for t in tasks]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows, described = [], None
    for dtype in parse_dtypes(args.dtype, device=device, traces=True):
        model = build_model(shape=shape_for(args), vocab=vocab, dtype=dtype, device=device)
        described = described or describe(model)
        rows += bench_batches(model, tasks, sizes, repeats=args.repeats)
        del model
    if not json_report(args, {"device": device, "model": described, "batch_sizes": sizes, "max_new_tokens": max_new,
                              "prompt_tokens": prompt_tokens, "results": rows}):
        print(f"model: {described}, {device}; one batch per size of the first requests of {', '.join(p.name for p in paths)} "
              f"in turn, prompts cut to their last {prompt_tokens} tokens, at most {max_new} new tokens each")
        print("tokens/s: generated tokens of all rows / wall time of the whole generate() call (prefill included); "
              "TTFT: the end of the first forward pass (the prefill); TPOT: (wall - TTFT) / (the longest row's tokens - 1), "
              "the time per output token a row sees; speedup, TPOT x: wall-clock and decoding speed over plain batched greedy, "
              f"vs PLD, TPOT vs PLD: over {PLD} (batch 1 only), same run; forwards: forward passes of the target; "
              "exact: every row equal to plain batched greedy's")
        print(format_table(
            ["batch", "dtype", "method", "tokens", "tokens/s", "speedup", "vs PLD k=16", "TTFT ms", "TPOT ms", "TPOT x", "TPOT vs PLD",
             "forwards", "exact"],
            [[r["batch"], r["dtype"], r["method"], r["tokens"], f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}x", _x(r["vs_pld"]),
              f"{r['ttft_ms']:.1f}", "-" if r["tpot_ms"] is None else f"{r['tpot_ms']:.2f}", _x(r["decode_speedup"]), _x(r["decode_vs_pld"]),
              r["forwards"], "yes" if r["exact"] else "NO"] for r in rows],
        ))
    return 0 if all(r["exact"] for r in rows) else 1


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"



def bench_batches(model, tasks: list[Task], sizes: list[int], *, repeats: int = 1) -> list[dict]:
    """Per batch size: plain batched greedy and ours (and transformers' prompt lookup at batch
    1, the only size it runs), taking turns, `repeats` times, on one batch of the first `size`
    tasks; each method timed by its fastest run (another process on the machine only ever adds
    time), exact only if every run was.

    Per row: seconds, time to first token (the first forward's end) and time per output token
    after it as one row of the batch sees it: (seconds - TTFT) / (the longest row's tokens - 1),
    so ttft_ms + tpot_ms * (longest_row_tokens - 1) == seconds * 1000 (unrounded).
    """
    dtype = str(model.dtype).removeprefix("torch.")
    warm = [Task(t.prompt[-32:], t.reference[:4], t.eos_token_id, 4) for t in tasks[:2]]
    for method in METHODS:
        _run(model, warm, method)
    _run(model, warm[:1], PLD)
    rows = []
    calls = sum(len(methods_at(size)) for size in sizes) * repeats
    with tqdm(total=calls, desc=f"{dtype} --batch", file=sys.stderr, leave=False, unit="call") as bar:
        for size in sizes:
            runs = {method: [] for method in methods_at(size)}
            for _ in range(repeats):
                for method in runs:
                    runs[method].append(_run(model, tasks[:size], method))
                    bar.update(1)
            expected = runs["plain batched greedy"][0][0]
            fastest = {method: min(results, key=lambda r: r[1].seconds)[1] for method, results in runs.items()}
            plain = fastest["plain batched greedy"]
            for method, results in runs.items():
                out, timing = results[0][0], fastest[method]
                tokens, longest = _generated(out, tasks[:size])
                tpot = (timing.seconds - timing.first_token_s) / (longest - 1) if longest > 1 else None
                plain_tpot = (plain.seconds - plain.first_token_s) / (longest - 1) if longest > 1 else None
                rows.append(dict(batch=size, dtype=dtype, method=method, tokens=tokens, longest_row_tokens=longest, seconds=timing.seconds,
                                 tokens_per_s=round(tokens / timing.seconds, 2), speedup=round(plain.seconds / timing.seconds, 3),
                                 ttft_ms=timing.first_token_s * 1e3, tpot_ms=None if tpot is None else tpot * 1e3,
                                 decode_speedup=round(plain_tpot / tpot, 3) if tpot else None,
                                 vs_pld=round(fastest[PLD].seconds / timing.seconds, 3) if PLD in fastest else None,
                                 decode_vs_pld=_decode_ratio(fastest.get(PLD), timing) if longest > 1 else None,
                                 forwards=results[0][1].forwards, exact=all(run == expected for run, _ in results)))
    return rows


METHODS = ("plain batched greedy", "lookahead.generate")  # and PLD at batch 1 only: transformers' assisted loops take one row


def methods_at(size: int) -> tuple[str, ...]:
    return METHODS + (PLD,) * (size == 1)


def _decode_ratio(pld: Timing | None, ours: Timing) -> float | None:
    """PLD's decode seconds over ours (same tokens): above 1, ours decodes faster."""
    return None if pld is None else round((pld.seconds - pld.first_token_s) / (ours.seconds - ours.first_token_s), 3)


def _run(model, tasks: list[Task], method: str) -> tuple[list[list[int]], Timing]:
    """One batched generate() call: (output rows, its timing). A batch of one is forced in the
    forward (traces.force_reference: no processor, so prompt lookup's candidate filter runs as
    for a user); a larger batch through FollowRows, a logits processor, for every method alike."""
    width = max(len(t.prompt) for t in tasks)
    ids = torch.tensor([[0] * (width - len(t.prompt)) + t.prompt for t in tasks], device=model.device)
    mask = torch.tensor([[0] * (width - len(t.prompt)) + [1] * len(t.prompt) for t in tasks], device=model.device)
    eos = sorted({t.eos_token_id for t in tasks if t.eos_token_id is not None})
    kwargs = dict(attention_mask=mask, max_new_tokens=max(t.max_new_tokens for t in tasks), do_sample=False,
                  eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
    if method == "lookahead.generate":
        kwargs |= dict(custom_generate=lookahead.generate, assistant=LookupDrafter())  # a fresh drafter per batch
    elif method == PLD:
        kwargs |= dict(methods())[PLD]()
    if len(tasks) == 1:
        with force_reference(model, len(tasks[0].prompt), tasks[0].reference):
            out, timing = timed_generate(model, ids, forced_options(kwargs))
    else:
        kwargs["logits_processor"] = LogitsProcessorList([FollowRows(ids, [t.reference for t in tasks])])
        out, timing = timed_generate(model, ids, kwargs)
    return out.tolist(), timing


def _generated(out: list[list[int]], tasks: list[Task]) -> tuple[int, int]:
    """Tokens the rows generated, summed and the longest row's: each row up to the first EOS
    of the batch's (its end; the rest is padding)."""
    prompt_width = max(len(t.prompt) for t in tasks)
    eos = {t.eos_token_id for t in tasks}
    counts = []
    for row in out:
        new = row[prompt_width:]
        counts.append(next((i + 1 for i, token in enumerate(new) if token in eos), len(new)))
    return sum(counts), max(counts)
