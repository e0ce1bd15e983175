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
"""

from types import SimpleNamespace

import numpy as np
import torch
from transformers import GenerationConfig

from lookahead.bench.e2e import PLD, bench_model, select_methods
from lookahead.bench.tables import format_table, json_report
from lookahead.bench.traces import Task, build_model, forced_trace_task, parse_dtypes, read_traces, trace_paths
from lookahead.integrations.assistant import AssistantConfig

# transformers' assisted loop with an assistant that never drafts: what `assistant_model=` costs before any drafter's work.
ASSISTED_FLOOR = "hf assisted loop, no drafts"
# ... and with one replaying our assistant's drafts of the same request: transformers' own work with our drafts.
ASSISTED_REPLAY = "hf assisted loop, our drafts replayed"
OURS = "lookahead assistant_model"  # the method whose drafts are replayed

# Forward well under a millisecond on one CPU thread: 1 layer, hidden 64.
OVERHEAD_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)


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
    if not json_report(args, {"device": device, "shape": OVERHEAD_SHAPE, "vocab": vocab, "requests": args.requests,
                              "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "results": rows}):
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
    return 0 if all(r["exact"] for r in rows) else 1


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
