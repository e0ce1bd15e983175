"""`lookahead bench --loop-overhead`: each method's seconds outside the target's forward, per verify step.

On a GPU an 8B decode step takes a few milliseconds, so what a loop does around the forward
(drafting, sizing, processors, cache bookkeeping, host syncs) is a large share of a step.
This mode makes the forward nearly free and measures the rest: a 1-layer random model
(OVERHEAD_SHAPE) over the traces' requests, forced in the forward to their recorded outputs,
each forward timed inside hooks (synchronised on CUDA), methods taking turns on each request.

Beside the methods, transformers' assisted loop twice more: with an assistant that never
drafts (ASSISTED_FLOOR), the part of `assistant_model=`'s cost that is transformers' loop
itself; and with one that offers, at no cost, the very drafts our `assistant_model=` offered
at the same step (ASSISTED_REPLAY: recorded as ours ran on the request just before, so its
steps are ours), the part that is transformers' handling of those drafts. What ours costs
above the second is our drafting, sizing and bookkeeping.

Vocabulary: the traces' ids are mapped one to one onto 0..U-1, U the distinct ids of the
requests run (a few thousand for 3 requests per file, against Llama-3's 128,256), so the LM
head stays small; drafts and acceptance depend only on which ids are equal, so every
method's steps are those at the real vocabulary. The work outside the forward that grows
with the vocabulary (argmax over logits, copies of them, processors) is priced at U.

With --rows 4,16: the same per batch of B rows, per row-step (a row's share of a verify step:
the seconds outside the forward over the rows each forward pass held, summed), plain batched
greedy against `lookahead.generate` on one left-padded batch of the first B requests of the
files in turn, each prompt's last --prompt-tokens (BATCH_PROMPT_TOKENS) tokens. Rows are told
apart inside the forward by their ids: each row's ids are mapped onto a range of its own
(rows_vocabulary), so the forcing (force_rows) reads a row's reference off its own token, as
rows leave our batch and its cache is compacted; rows then share no id, so a batch's drafts
come from each row's own tokens, never from a finished row's (the shared memory's).
"""

from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import torch
from transformers import GenerationConfig

import lookahead
from lookahead.bench.e2e import PLD, bench_model, select_methods
from lookahead.bench.tables import format_table, json_report
from lookahead.bench.timing import timed_generate
from lookahead.bench.traces import (
    Task, build_model, forced_trace_task, forward_hooks, parse_dtypes, parse_sizes, read_traces, trace_paths,
)
from lookahead import LookupDrafter
from lookahead.integrations.assistant import AssistantConfig

# transformers' assisted loop with an assistant that never drafts: what `assistant_model=` costs before any drafter's work.
ASSISTED_FLOOR = "hf assisted loop, no drafts"
# ... and with one replaying our assistant's drafts of the same request: transformers' own work with our drafts.
ASSISTED_REPLAY = "hf assisted loop, our drafts replayed"
OURS = "lookahead assistant_model"  # the method whose drafts are replayed

# Forward well under a millisecond on one CPU thread: 1 layer, hidden 64.
OVERHEAD_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
BATCH_METHODS = ("plain batched greedy", "lookahead.generate")  # --rows: each batch's methods, the first the baseline
BATCH_PROMPT_TOKENS = 256  # --rows without --prompt-tokens: each prompt's last 256 tokens


def run_loop_overhead(args) -> int:
    """Runs `lookahead bench --loop-overhead`; 0 when every output is exact (or there are no traces: skipped)."""
    paths = trace_paths(args, "--loop-overhead")
    if not paths:
        return 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    (dtype, *more) = parse_dtypes(args.dtype, device=device, traces=False)
    if more:
        raise ValueError(f"--loop-overhead takes one --dtype, got {args.dtype!r}")
    rows, vocab = loop_overhead(paths, requests=args.requests, max_new_tokens=args.max_new_tokens, dtype=dtype, device=device,
                                repeats=args.repeats, methods_spec=args.methods)
    sizes = [] if args.rows is None else parse_sizes(args.rows, option="--rows", least=1, example="4,16")
    prompt_tokens = args.prompt_tokens or BATCH_PROMPT_TOKENS
    batches = rows_overhead(paths, sizes=sizes, prompt_tokens=prompt_tokens, max_new_tokens=args.max_new_tokens, dtype=dtype,
                            device=device, repeats=args.repeats) if sizes else []
    if not json_report(args, {"device": device, "shape": OVERHEAD_SHAPE, "vocab": vocab, "requests": args.requests,
                              "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "results": rows,
                              **({"prompt_tokens": prompt_tokens, "batches": batches} if sizes else {})}):
        print(f"model: 1-layer random Qwen2 (hidden {OVERHEAD_SHAPE['hidden_size']}), the traces' ids mapped onto a vocabulary of {vocab}, "
              f"{str(dtype).removeprefix('torch.')}, {device}; {args.requests} request(s) per file, at most {args.max_new_tokens} new tokens each")
        print("outside: wall clock minus the time inside the target's forward passes (each timed in hooks"
              + (", synchronised" if device == "cuda" else "") + "), per forward pass (a verify step; the prefill's included) and per generated "
              "token; x greedy / x PLD: outside per step over greedy's / prompt lookup's, same run (below 1: cheaper)"
              + (f"; each request's run with the least outside time of {args.repeats}" if args.repeats > 1 else ""))
        print(format_table(
            ["file", "method", "forward us", "outside us/step", "outside us/token", "x greedy", "x PLD", "tau", "exact"],
            [[r["file"], r["method"], f"{r['forward_us']:.0f}", f"{r['outside_us_per_step']:.0f}", f"{r['outside_us_per_token']:.0f}",
              f"{r['x_greedy']:.2f}", f"{r['x_pld']:.2f}", f"{r['tau']:.2f}", "yes" if r["exact"] else "NO"] for r in rows],
        ))
        if batches:
            print(f"\nbatches: the first B requests of the files in turn, prompts cut to their last {prompt_tokens} tokens, each row's ids "
                  "a range of their own; outside: as above, per verify step and per row-step (its share of a step: over the rows "
                  "each forward held, summed); x plain: per row-step over plain batched greedy's, same run; exact: every row "
                  "equal to plain batched greedy's")
            print(format_table(
                ["batch", "method", "forwards", "row-steps", "forward us", "outside us/step", "outside us/row-step", "x plain", "exact"],
                [[r["batch"], r["method"], r["forwards"], r["row_steps"], f"{r['forward_us']:.0f}", f"{r['outside_us_per_step']:.0f}",
                  f"{r['outside_us_per_row_step']:.1f}", f"{r['x_plain']:.2f}", "yes" if r["exact"] else "NO"] for r in batches],
            ))
    return 0 if all(r["exact"] for r in rows + batches) else 1


def compact_vocabulary(tasks: dict[str, list[Task]]) -> tuple[dict[str, list[Task]], int]:
    """The tasks with their ids mapped one to one onto 0..U-1 (sorted order), and U."""
    ids = sorted({i for requests in tasks.values() for t in requests for i in t.prompt + t.reference + [t.eos_token_id] if i is not None})
    new = {old: i for i, old in enumerate(ids)}
    remap = lambda t: Task([new[i] for i in t.prompt], [new[i] for i in t.reference], None if t.eos_token_id is None else new[t.eos_token_id],  # noqa: E731
                           t.max_new_tokens)
    return {name: [remap(t) for t in requests] for name, requests in tasks.items()}, max(len(ids), 2)


def loop_overhead(paths, *, requests: int, max_new_tokens: int, dtype, device: str, repeats: int = 1, methods_spec: str | None = None) -> tuple[list[dict], int]:
    """Rows per (file, method) and the compact vocabulary's size."""
    tasks = {name: [forced_trace_task(r, max_new_tokens) for r in loaded] for name, loaded in read_traces(list(paths), requests, None).items()}
    tasks, vocab = compact_vocabulary(tasks)
    model = build_model(shape=OVERHEAD_SHAPE, vocab=vocab, dtype=dtype, device=device)
    methods = select_methods(methods_spec)
    if methods_spec is None:
        drafts = {}  # (prompt, sequence length) -> what our assistant offered there
        methods = [(name, recording(make, drafts) if name == OURS else make) for name, make in methods]
        methods.append((ASSISTED_FLOOR, lambda: dict(assistant_model=NoDrafts(vocab, model.device))))
        methods.append((ASSISTED_REPLAY, lambda: dict(assistant_model=Replayed(vocab, model.device, drafts))))
    rows = bench_model(model, tasks, methods, repeats=repeats, label="file", forward_time=True, summary=overhead_summary)
    return rows, vocab


class NoDrafts:
    """An `assistant_model=` that offers transformers' assisted loop no draft at any step (the
    loop needs one score to stack: a placeholder); its output is plain greedy's."""

    def __init__(self, vocab: int, device):
        self.config = AssistantConfig(is_encoder_decoder=False, vocab_size=vocab)
        self.device = device
        self.generation_config = GenerationConfig(num_assistant_tokens=1, num_assistant_tokens_schedule="constant",
                                                  assistant_confidence_threshold=0.0)
        self.scores = (torch.zeros((1, 1), device=device),)

    def _supports_logits_to_keep(self) -> bool:
        return False

    def generate(self, input_ids, **kwargs):
        return SimpleNamespace(sequences=input_ids, scores=self.scores, cache=None, past_key_values=None)


def prompt_key(input_ids, kwargs, key: list):
    """(the request's prompt, the sequence's length): the prompt read at a request's first call (no cache passed yet), into key[0]."""
    if "cache" not in kwargs and "past_key_values" not in kwargs:
        key[0] = hash(tuple(input_ids[0].tolist()))
    return key[0], input_ids.shape[1]


def recording(make, drafts: dict):
    """`make` (a method's options with an `assistant_model=` LookupDrafter), its drafter's answers
    recorded into `drafts`: a dict update and a tensor view per step on top of its own work."""
    def make_recording():
        options = make()
        drafter, key = options["assistant_model"], [None]
        generate = drafter.generate

        def recorded(input_ids, **kwargs):
            at = prompt_key(input_ids, kwargs, key)
            out = generate(input_ids, **kwargs)
            drafts[at] = (out.sequences[:, input_ids.shape[1] :], out.scores)
            return out

        drafter.generate = recorded  # the instance's, not the class's
        return options
    return make_recording


class Replayed(NoDrafts):
    """An `assistant_model=` offering what our assistant offered at the same request and length
    (`recording`), without drafting: transformers' assisted loop with our drafts, at no drafter's cost."""

    def __init__(self, vocab: int, device, drafts: dict):
        super().__init__(vocab, device)
        self.drafts, self.key = drafts, [None]

    def generate(self, input_ids, **kwargs):
        candidates, scores = self.drafts[prompt_key(input_ids, kwargs, self.key)]
        return SimpleNamespace(sequences=torch.cat((input_ids, candidates), dim=1), scores=scores, cache=None, past_key_values=None)


def overhead_summary(per_run: list[dict[str, dict]], method: str) -> dict:
    """A method's seconds outside the forward, from each request's run with the least of them:
    per verify step (forward passes, the prefill's included) and per generated token, and per
    step against greedy's (x greedy: 1.0 costs what plain decoding's loop costs)."""
    def picked(name):  # (outside s, forward s, forwards, wall s) summed over each request's best run
        t = [run[name] for run in per_run]
        outside = np.array([[s - f for s, f in zip(r["request_seconds"], r["request_forward_s"])] for r in t])  # (runs, requests)
        pick = outside.argmin(axis=0), np.arange(outside.shape[1])
        take = lambda key: float(np.array([r[key] for r in t])[pick].sum())  # noqa: E731
        return float(outside[pick].sum()), take("request_forward_s"), int(take("request_forwards")), take("request_seconds")

    outside, inside, forwards, seconds = picked(method)
    greedy_outside, _, greedy_forwards, _ = picked("greedy")
    pld_outside, _, pld_forwards, _ = picked(PLD)
    tokens = per_run[0][method]["tokens"]
    per_step = outside / forwards
    return dict(tokens=tokens, forwards=forwards, tau=round(tokens / forwards, 3), seconds=seconds, forward_s=inside,
                forward_us=inside / forwards * 1e6, outside_us_per_step=per_step * 1e6, outside_us_per_token=outside / tokens * 1e6,
                x_greedy=round(per_step / (greedy_outside / greedy_forwards), 3), x_pld=round(per_step / (pld_outside / pld_forwards), 3),
                exact=all(run[method]["exact"] for run in per_run))


def rows_vocabulary(tasks: list[Task]) -> tuple[list[Task], list[int]]:
    """The tasks with row r's ids mapped one to one onto a range of its own (ranges in row order), and per id
    the row whose range holds it; the vocabulary is that list's length + 1, its last id the padding (no row's)."""
    mapped, owner = [], []
    for r, t in enumerate(tasks):
        ids = sorted(set(t.prompt + t.reference + [t.eos_token_id]))
        new = {old: len(owner) + i for i, old in enumerate(ids)}
        mapped.append(Task([new[i] for i in t.prompt], [new[i] for i in t.reference], new[t.eos_token_id], t.max_new_tokens))
        owner += [r] * len(ids)
    return mapped, owner


@contextmanager
def force_rows(model, tasks: list[Task], owner: list[int], counts: dict):
    """Within the block, a forward's row holding row r's ids (rows_vocabulary's `owner`: r is read off the row's
    first id that is not the padding, len(owner)), at position p (position_ids: its real tokens before it), makes
    tasks[r].reference[p + 1 - len(prompt)] the argmax of its logits (as traces.force_reference, per row).
    counts["row_steps"] sums the rows of every forward. A few tensor ops per forward, no host sync."""
    device, pad = model.device, len(owner)
    owner = torch.tensor(owner + [-1], device=device)  # (vocab,) the row whose range holds the id (-1: the padding)
    longest = max(len(t.reference) for t in tasks)
    target = torch.tensor([t.reference + [0] * (longest - len(t.reference)) for t in tasks], device=device)  # (tasks, longest)
    lengths = torch.tensor([len(t.reference) for t in tasks], device=device)  # (tasks,)
    prompt_lens = torch.tensor([len(t.prompt) for t in tasks], device=device)  # (tasks,)
    step = {}  # the forward in flight: its rows' tasks and positions

    def before(module, args, kwargs):
        ids, positions = kwargs.get("input_ids", args[0] if args else None), kwargs.get("position_ids")
        if positions is None:
            raise ValueError("force_rows reads each row's positions: the forward got no position_ids")
        first_real = (ids != pad).int().argmax(dim=1, keepdim=True)  # (rows, 1)
        step["rows"], step["positions"] = owner[ids.gather(1, first_real)[:, 0]], positions
        counts["row_steps"] += ids.shape[0]

    def after(module, args, kwargs, output):
        logits, rows = output.logits, step["rows"]  # (rows, K, vocab): the last K positions of the block
        t = step["positions"][:, -logits.shape[1] :] + 1 - prompt_lens[rows][:, None]  # (rows, K) the reference index each predicts
        valid = (t >= 0) & (t < lengths[rows][:, None]) & (rows[:, None] >= 0)  # rows < 0: a finished row's padding (plain generate's)
        tokens = target[rows[:, None], t.clamp(0, longest - 1)]
        top = logits.max(-1).values
        at = logits.gather(2, tokens[..., None])[..., 0]
        logits.scatter_(2, tokens[..., None], torch.where(valid, top + top.abs() / 32 + 1, at)[..., None])
        return output

    with forward_hooks(model, before, after):
        yield


def rows_overhead(paths, *, sizes: list[int], prompt_tokens: int, max_new_tokens: int, dtype, device: str, repeats: int = 1) -> list[dict]:
    """Rows per (batch size, method): seconds outside the forward per verify step and per row-step, each
    method's run with the least outside time of `repeats` (methods taking turns, the first alternating)."""
    per_file = read_traces(list(paths), max(sizes), None)
    pooled = [request for group in zip(*per_file.values()) for request in group]  # the files in turn
    pooled += [r for requests in per_file.values() for r in requests[len(pooled) // len(per_file) :]]
    if len(pooled) < max(sizes):
        raise ValueError(f"--rows {max(sizes)} needs {max(sizes)} requests; the trace files hold {len(pooled)}")
    tasks = [forced_trace_task(r, max_new_tokens) for r in pooled[: max(sizes)]]
    tasks = [Task(t.prompt[-prompt_tokens:], t.reference, t.eos_token_id, t.max_new_tokens) for t in tasks]
    tasks, owner = rows_vocabulary(tasks)
    model = build_model(shape=OVERHEAD_SHAPE, vocab=len(owner) + 1, dtype=dtype, device=device)
    warm = [Task(t.prompt[-16:], t.reference[:4], t.eos_token_id, 4) for t in tasks[:2]]
    for method in BATCH_METHODS:
        run_rows(model, warm, owner, method)
    out = []
    for size in sizes:
        runs = {method: [] for method in BATCH_METHODS}
        for repeat in range(repeats):
            for method in BATCH_METHODS[repeat % 2 :] + BATCH_METHODS[: repeat % 2]:
                runs[method].append(run_rows(model, tasks[:size], owner, method))
        expected = runs[BATCH_METHODS[0]][0]["output"]
        best = {method: min(results, key=lambda r: r["outside_s"]) for method, results in runs.items()}
        plain = best[BATCH_METHODS[0]]
        for method, results in runs.items():
            r = best[method]
            out.append(dict(batch=size, method=method, forwards=r["forwards"], row_steps=r["row_steps"], seconds=r["seconds"],
                            forward_us=r["forward_s"] / r["forwards"] * 1e6, outside_us_per_step=r["outside_s"] / r["forwards"] * 1e6,
                            outside_us_per_row_step=r["outside_s"] / r["row_steps"] * 1e6,
                            x_plain=round((r["outside_s"] / r["row_steps"]) / (plain["outside_s"] / plain["row_steps"]), 3),
                            outside_us_per_row_step_runs=[run["outside_s"] / run["row_steps"] * 1e6 for run in results],
                            exact=all(run["output"] == expected for run in results)))
    return out


def run_rows(model, tasks: list[Task], owner: list[int], method: str) -> dict:
    """One batched generate() call of `method` on the tasks (row r's ids in owner's range r, rows_vocabulary), left-padded,
    forced (force_rows): its output rows, seconds, seconds inside and outside the forward, forward passes and row-steps."""
    pad = len(owner)
    width = max(len(t.prompt) for t in tasks)
    ids = torch.tensor([[pad] * (width - len(t.prompt)) + t.prompt for t in tasks], device=model.device)
    mask = torch.tensor([[0] * (width - len(t.prompt)) + [1] * len(t.prompt) for t in tasks], device=model.device)
    kwargs = dict(attention_mask=mask, max_new_tokens=max(t.max_new_tokens for t in tasks), do_sample=False,
                  eos_token_id=[t.eos_token_id for t in tasks], pad_token_id=pad)
    if method == "lookahead.generate":  # a fresh drafter per batch; the table learns from the kept path (traces.forced_options)
        kwargs |= dict(custom_generate=lookahead.generate, assistant=LookupDrafter(), record_rejected=False)
    counts = dict(row_steps=0)
    with force_rows(model, tasks, owner, counts):
        out, timing = timed_generate(model, ids, kwargs, forward_time=True)
    return dict(output=out.tolist(), seconds=timing.seconds, forward_s=timing.forward_s, outside_s=timing.seconds - timing.forward_s,
                forwards=timing.forwards, row_steps=counts["row_steps"])
