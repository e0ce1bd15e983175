"""`lookahead bench --blend`: lookup, the model's own predictions and their blend on a real model, unforced.

Tokens per verify step of `lookahead.generate` with unsized drafts (`cost_aware=False`: every
draft verified whole, so τ does not depend on timings) over story openings (STORY_OPENINGS,
or --prompts), greedy and sampled at temperature 0.8, with one drafter kept across the
requests (memory and table kept) and a fresh drafter per request; for each: lookup alone
(`predictions=False`), the table alone (`drafter.lookup = False`) and the blend (the default),
chains and trees. Greedy outputs are checked equal across the sources (each must equal plain
greedy, which tests/ check). `--time-blend` instead times the default drafter (sized, tree=None)
with and without the table against plain generate, greedy and sampled, fresh and kept drafters,
per --dtype: wall-clock milliseconds per new token (`--forward-cost`: at a bigger model's cost curve).
"""

import contextlib
import json
import sys
import time

import torch
import transformers

import lookahead
from lookahead.bench.replay import SOURCES, drafter_for
from lookahead.bench.tables import format_table, json_report
from lookahead.bench.traces import load_model, parse_dtypes

# 30 story openings (first sentences in the TinyStories manner, written for this bench).
STORY_OPENINGS = [
    "Once upon a time, there was a little girl named Lily.",
    "Tom had a big red ball that he loved very much.",
    "One day, a small dog went to the park with his mom.",
    "There was a happy cat who lived in a blue house.",
    "Sara and Ben were best friends who liked to play outside.",
    "Once upon a time, in a big forest, there lived a brown bear.",
    "Max wanted to build a tall tower with his blocks.",
    "It was a sunny day and the birds were singing.",
    "Anna found a shiny coin under her bed.",
    "The little boat sailed on the big lake.",
    "Once there was a kind old man who had a garden.",
    "Lucy liked to draw pictures of flowers and trees.",
    "A little bird could not fly because its wing was hurt.",
    "Tim and his dad went to the store to buy some milk.",
    "The sun was hot, so Mia wanted to eat ice cream.",
    "Once upon a time, there was a big green frog.",
    "Jack had a toy car that was fast and red.",
    "One morning, Sue woke up and saw snow outside.",
    "There was a little mouse who lived in a hole in the wall.",
    "Ben was sad because he lost his favorite hat.",
    "Mom baked a cake for Lily's birthday.",
    "The princess lived in a tall castle on a hill.",
    "Once upon a time, a little fish swam in the sea.",
    "Sam liked to run and jump in the yard.",
    "A girl named Amy had a pet bunny called Fluffy.",
    "The farmer had a cow, a pig and a sheep.",
    "One day, Tom saw a big truck on the road.",
    "Lily and her brother played with a kite in the park.",
    "There was a shy owl who lived in an old tree.",
    "Once upon a time, a little girl wanted to find a treasure.",
]
TEMPERATURE = 0.8


def prompt_ids(tokenizer, texts: list[str]) -> list[torch.Tensor]:
    return [tokenizer(text, return_tensors="pt").input_ids for text in texts]


def measure_tau(model, prompts: list[torch.Tensor], *, source: str, tree: bool, sample: bool, kept: bool, max_new_tokens: int,
                seed: int = 0) -> tuple[float, list[list[int]]]:
    """(tokens per verify step over every request, each request's output) with unsized drafts."""
    drafter = drafter_for(source, cost_aware=False)
    tokens = steps = 0
    outputs = []
    for i, ids in enumerate(prompts):
        if not kept:
            drafter = drafter_for(source, cost_aware=False)
        options = dict(do_sample=True, temperature=TEMPERATURE, top_k=0) if sample else dict(do_sample=False)
        torch.manual_seed(seed + i)
        out = lookahead.generate(model, ids, drafter=drafter, tree=tree, max_new_tokens=max_new_tokens, **options)
        outputs.append(out[0, ids.shape[1] :].tolist())
        tokens, steps = tokens + drafter.stats.tokens, steps + drafter.stats.steps
    return tokens / steps, outputs


def measure_taus(model, prompts, *, max_new_tokens: int, progress=None) -> list[dict]:
    rows = []
    for sample in (False, True):
        for kept in (True, False):
            for tree in (False, True):
                greedy_outputs = None
                for source in SOURCES:
                    start = time.perf_counter()
                    tau, outputs = measure_tau(model, prompts, source=source, tree=tree, sample=sample, kept=kept,
                                               max_new_tokens=max_new_tokens)
                    if not sample:  # every source is exact: the same greedy outputs
                        if greedy_outputs is not None and outputs != greedy_outputs:
                            raise AssertionError(f"greedy outputs differ between sources ({source}, tree={tree}, kept={kept})")
                        greedy_outputs = outputs
                    rows.append(dict(sampling=f"sampled t={TEMPERATURE}" if sample else "greedy", drafter="kept" if kept else "fresh",
                                     draft="tree" if tree else "chain", source=source, tau=round(tau, 3),
                                     seconds=round(time.perf_counter() - start, 1)))
                    if progress is not None:
                        progress(rows[-1])
    return rows


@contextlib.contextmanager
def forward_cost(model, fixed_ms: float, per_token_ms: float):
    """Every forward of `model` also sleeps fixed_ms + per_token_ms * (the tokens it scores): a bigger model's
    cost curve (a GPU's: a large fixed part, tokens nearly free; a CPU's: every token costs) with this
    model's own predictions. Sleeping stands in for the device's time: the host is idle meanwhile, as
    it is while an accelerator computes, so the drafting work is timed as it would be beside it.
    Torch runs one thread meanwhile: woken after a sleep, its thread pool made the next forward of
    stories260K 9 ms slower at 2 threads (1 ms at one), on this 2-core host."""
    def sleep(module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        time.sleep((fixed_ms + per_token_ms * (ids.numel() if ids is not None else 1)) / 1e3)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    handle = model.register_forward_hook(sleep, with_kwargs=True)
    try:
        yield model
    finally:
        handle.remove()
        torch.set_num_threads(threads)


# --time-blend's methods: name -> what drafts (a source of the default drafter; unsized: the blend's whole trees, every
# node verified, as --blend's tau grid drafts them); the default's, all but unsized.
TIMED = {"plain": None, "lookup (default drafter)": "lookup", "blend (default drafter)": "blend", "blend unsized (whole trees)": "unsized"}


def timed_methods(spec: str | None) -> dict:
    """--time-blend's methods from a comma list of TIMED's names or what drafts (plain, lookup, blend, unsized); lookup
    always among them; None: plain, lookup and blend."""
    if spec is None:
        return {name: source for name, source in TIMED.items() if source != "unsized"}
    asked = {part.strip() for part in spec.split(",") if part.strip()}
    unknown = asked - set(TIMED) - {"plain", *filter(None, TIMED.values())}
    if unknown:
        raise ValueError(f"--time-blend's methods are plain, lookup, blend and unsized, got {', '.join(sorted(unknown))}")
    return {name: source for name, source in TIMED.items() if source == "lookup" or name in asked or (source or "plain") in asked}


def timed_drafter(source: str):
    """A fresh drafter for a --time-blend method drafting from `source` (TIMED's values but plain's)."""
    return drafter_for("blend", cost_aware=False) if source == "unsized" else drafter_for(source)


def measure_tpot(model, prompts, *, max_new_tokens: int, repeats: int, kept: bool = True, sample: bool = False,
                 names: dict | None = None) -> list[dict]:
    """ms per new token of plain generate and of the default drafter (sized, tree=None) with lookup alone and
    with the blend, greedy or sampled at TEMPERATURE (each request's seed the same for every method): the
    methods take turns on every request, each request's fastest of `repeats` runs counts. `kept`: one
    drafter per source for all the requests of a repeat (memory, table and learnt chances kept across
    them), else a fresh one per request; new drafters each repeat (a repeat must not draft from the last
    one's outputs). Also, per method, the min-max over the repeats of its summed time over plain's (where
    `names`, a subset of TIMED, holds it) and over lookup's (below 1: faster)."""
    names = dict(TIMED) if names is None else names
    options = dict(do_sample=True, temperature=TEMPERATURE, top_k=0) if sample else dict(do_sample=False)
    model.generate(prompts[0][:, :8], max_new_tokens=8, **options)  # warm: torch's first shapes
    for source in dict.fromkeys(filter(None, names.values())):  # the kernels, the costs' first steps
        lookahead.generate(model, prompts[0][:, :8], drafter=timed_drafter(source), max_new_tokens=8, **options)
    seconds = {name: [[0.0] * len(prompts) for _ in range(repeats)] for name in names}
    produced = [0] * len(prompts)
    counts = {name: [0, 0] for name in names}  # tokens, steps of the drafted methods
    for k in range(repeats):
        drafters = {name: timed_drafter(source) for name, source in names.items() if source is not None}
        for i, ids in enumerate(prompts):
            for name, source in names.items():
                drafter = None
                if source is not None:
                    drafter = drafters[name] if kept else timed_drafter(source)
                torch.manual_seed(i)
                start = time.perf_counter()
                if drafter is None:
                    out = model.generate(ids, max_new_tokens=max_new_tokens, **options)
                else:
                    out = lookahead.generate(model, ids, drafter=drafter, max_new_tokens=max_new_tokens, **options)
                seconds[name][k][i] = time.perf_counter() - start
                produced[i] = out.shape[1] - ids.shape[1]
                if drafter is not None:
                    counts[name][0] += drafter.stats.tokens
                    counts[name][1] += drafter.stats.steps
    rows = []
    for name in names:
        best = [min(seconds[name][k][i] for k in range(repeats)) for i in range(len(prompts))]
        tokens, steps = counts[name]
        row = dict(sampling=f"sampled t={TEMPERATURE}" if sample else "greedy", drafter="kept" if kept else "fresh", source=name,
                   ms_per_token=round(1e3 * sum(best) / sum(produced), 3), tau=round(tokens / steps, 3) if steps else 1.0)
        for base, key in (("plain", "over_plain"), ("lookup (default drafter)", "over_lookup")):
            if base in names:
                over = [sum(seconds[name][k]) / sum(seconds[base][k]) for k in range(repeats)]
                row[f"{key}_min"], row[f"{key}_max"] = round(min(over), 3), round(max(over), 3)
        rows.append(row)
    return rows


def run_blend_bench(args) -> int:
    if not args.model:
        raise ValueError("--blend runs a real model: give --model (e.g. ../shared/models/stories260K)")
    tokenizer = load_model(transformers.AutoTokenizer, args.model)
    if args.prompts:
        texts = [line for line in args.prompts.read_text().splitlines() if line.strip()][: args.requests]
    else:
        texts = STORY_OPENINGS[: args.requests]
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the timing on a GPU runs at the device's own step costs
    prompts = [ids.to(device) for ids in prompt_ids(tokenizer, texts)]
    report = dict(model=args.model, device=device, requests=len(prompts), max_new_tokens=args.max_new_tokens,
                  date=time.strftime("%Y-%m-%d %H:%M"))
    dtypes = parse_dtypes(args.dtype or "float32", device=device, traces=False)
    model = load_model(transformers.AutoModelForCausalLM, args.model, dtype=dtypes[0]).to(device).eval()
    if args.time_blend:
        names = timed_methods(args.methods)
        report["forward_cost"] = args.forward_cost
        report["tpot"] = []
        for dtype in dtypes:
            model = load_model(transformers.AutoModelForCausalLM, args.model, dtype=dtype).to(device).eval()
            cost = forward_cost(model, *args.forward_cost) if args.forward_cost else contextlib.nullcontext()
            with cost:
                for sample in (False, True):
                    for kept in (False, True):
                        for row in measure_tpot(model, prompts, max_new_tokens=args.max_new_tokens, repeats=args.repeats, kept=kept,
                                                sample=sample, names=names):
                            report["tpot"].append(dict(dtype=str(dtype).removeprefix("torch."), **row))
                            print(json.dumps(report["tpot"][-1]), file=sys.stderr, flush=True)
        if not json_report(args, report):
            print(format_table(["dtype", "sampling", "drafter", "method", "ms/token", "tau", "time over plain's", "time over lookup's"],
                               [[r["dtype"], r["sampling"], r["drafter"], r["source"], r["ms_per_token"], r["tau"],
                                 f"{r['over_plain_min']:.2f}-{r['over_plain_max']:.2f}" if "over_plain_min" in r else "-",
                                 f"{r['over_lookup_min']:.2f}-{r['over_lookup_max']:.2f}"]
                                for r in report["tpot"]]))
        return 0
    report["tau"] = measure_taus(model, prompts, max_new_tokens=args.max_new_tokens,
                                 progress=lambda row: print(json.dumps(row), file=sys.stderr, flush=True))
    if json_report(args, report):
        return 0
    taus = {(r["sampling"], r["drafter"], r["draft"], r["source"]): r["tau"] for r in report["tau"]}
    lines = []
    for (sampling, drafter, draft) in dict.fromkeys(k[:3] for k in taus):
        lookup, table, blend = (taus[(sampling, drafter, draft, s)] for s in SOURCES)
        lines.append([sampling, drafter, draft, f"{lookup:.2f}", f"{table:.2f}", f"{blend:.2f}", f"{blend / lookup:.2f}x"])
    print(format_table(["sampling", "drafter", "draft", "lookup", "table", "blend", "blend / lookup"], lines))
    return 0
