"""Model-free replay of recorded greedy outputs: the exact tokens per verify step of a drafter.

Under greedy verification a drafted token is kept iff it equals the recorded next token,
so replaying a trace gives a drafter's exact τ without running the model.

The trace format, for users: docs/traces.md. A trace file is JSON lines, each with
`prompt_token_ids` and `generated_token_ids` (lists of ints); `acc_ngram.acc_len[i]`
(optional) is a recorded reference: the tokens a verify step starting at output position i
produced with vLLM's n-gram proposer (it records no drafted count and no drafting time).

`topk_token_ids` (optional) carries the model's predictions: one row per token of
prompt + output, row i the k ids the model ranked likeliest after tokens[: i + 1] (k the
same for every row, ids distinct, likeliest first; so under greedy the first id of row
len(prompt) - 1 + j is output[j]). `lookahead bench --write-trace` writes such traces from
a real model. With them, replay feeds the drafter's prediction table as `lookahead.generate`
does, for what a trace knows: each step records the top-k at the block entries on the kept
path (the token before the step's first written token, then each written token but the
last). The rejected draft nodes' predictions are not in a trace (the model never ran on
them), so replay's table learns from the kept path only, where the loop learns from them
too (`lookahead.generate(..., record_rejected=True)`, the default): replayed blend τ is below the loop's on stories260K, though
not a bound in every case (docs/benchmarks.md, the replay section).
"""

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from lookahead import LookupDrafter
from lookahead.index import MAX_TOKEN_ID
from lookahead.request import Request
from lookahead.sizing.cost import SIZES, CostCurve, cost_curve


TRACE_VOCAB_SIZE = 128_256  # Llama-3's tokenizer, which wrote ../shared/traces
SOURCES = ("lookup", "table", "blend")  # what a drafter drafts from: lookup alone, the prediction table alone, both (the default)


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the file and line."""


@dataclass(frozen=True)
class TraceRequest:
    prompt: np.ndarray  # (prompt_len,) int64
    output: np.ndarray  # (output_len,) int64, the model's greedy output
    recorded_acc_len: np.ndarray | None  # (output_len,) tokens per step from each position, or None
    topk: np.ndarray | None = None  # (prompt_len + output_len, k) int64: topk[i] the model's likeliest ids after token i, or None


@dataclass
class ReplayResult:
    file: str
    drafter: str
    tau: float  # mean tokens per verify step, bonus token included
    steps: int
    tokens: int
    drafted: int | None  # None for a recorded reference: the trace holds no drafted count
    accepted: int
    us_per_step: float | None  # drafting cost (extend + propose), microseconds per step; None for a recorded reference
    speedup: float | None = None  # with a cost curve: tokens / modelled verify cost (plain greedy: 1)

    def as_dict(self) -> dict:
        return asdict(self)


def load_trace(path: str | Path) -> list[TraceRequest]:
    """Reads and validates a trace file."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    requests = []
    with path.open() as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(f"{where}: not JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise TraceError(f"{where}: expected a JSON object, got {type(row).__name__}")
            prompt = _token_list(row, "prompt_token_ids", where)
            output = _token_list(row, "generated_token_ids", where)
            acc = row.get("acc_ngram", {})
            acc_len = acc.get("acc_len") if isinstance(acc, dict) else None
            if acc_len is not None:
                acc_len = np.asarray(acc_len, dtype=np.int64)
                if acc_len.shape[0] < output.shape[0] or (acc_len[: output.shape[0]] < 1).any():
                    acc_len = None  # not usable as a reference; the replay itself does not need it
            topk = _topk_rows(row, prompt.shape[0] + output.shape[0], where) if "topk_token_ids" in row else None
            requests.append(TraceRequest(prompt, output, acc_len, topk))
    if not requests:
        raise TraceError(f"{path}: no requests (empty file)")
    return requests


def _token_list(row: dict, key: str, where: str) -> np.ndarray:
    if key not in row:
        raise TraceError(f"{where}: missing key {key!r}")
    value = row[key]
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise TraceError(f"{where}: {key!r} must be a list of integer token ids")
    if any(t < 0 for t in value):
        raise TraceError(f"{where}: {key!r} holds a negative token id")
    too_large = next((t for t in value if t > MAX_TOKEN_ID), None)
    if too_large is not None:
        raise TraceError(f"{where}: {key!r} holds token id {too_large}, above the largest lookahead indexes ({MAX_TOKEN_ID})")
    return np.asarray(value, dtype=np.int64)


def _topk_rows(row: dict, positions: int, where: str) -> np.ndarray:
    """`topk_token_ids` as a (positions, k) int64 array: k >= 1 distinct non-negative ids per row, one row per token."""
    value = row["topk_token_ids"]
    if not isinstance(value, list) or len(value) != positions:
        got = f"{len(value)} rows" if isinstance(value, list) else type(value).__name__
        raise TraceError(f"{where}: 'topk_token_ids' must hold one row per prompt and output token ({positions}), got {got}")
    k = len(value[0]) if value and isinstance(value[0], list) else 0
    for pos, ids in enumerate(value):
        if not isinstance(ids, list) or len(ids) != k or not k or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise TraceError(f"{where}: 'topk_token_ids'[{pos}] must be a list of k integer token ids (k >= 1, as many in "
                             f"every row; row 0 has {k})")
        bad = next((t for t in ids if t < 0 or t > MAX_TOKEN_ID), None)
        if bad is not None:
            raise TraceError(f"{where}: 'topk_token_ids'[{pos}] holds token id {bad}, outside [0, {MAX_TOKEN_ID}]")
    topk = np.asarray(value, dtype=np.int64).reshape(positions, max(k, 1))
    ranked = np.sort(topk, axis=1)
    repeated = np.flatnonzero((ranked[:, 1:] == ranked[:, :-1]).any(axis=1))
    if repeated.shape[0]:
        raise TraceError(f"{where}: 'topk_token_ids'[{repeated[0]}] names an id twice: {value[repeated[0]]}")
    return topk


def drafter_for(source: str, **options) -> LookupDrafter:
    """A drafter drafting from `source` (SOURCES): lookup alone, the prediction table alone, or both (the default)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    drafter = LookupDrafter(predictions=source != "lookup", **options)
    drafter.lookup = source != "table"
    return drafter


def replay_lookahead(requests, drafter: LookupDrafter | Callable[[], LookupDrafter], *, tree: bool = False, max_tree_nodes: int = 64,
                     costs: np.ndarray | None = None, progress: str | None = None) -> dict:
    """Replays `requests` in order through `drafter`; returns the summed counts and drafting time.

    `drafter`: one LookupDrafter for every request (its memory and prediction table kept
    across them), or a function returning a fresh one per request. With `tree`, each step
    drafts a tree (at most max_tree_nodes tokens) and keeps the longest root path that the
    recorded output follows. With `costs` (cost[n]: verifying n tokens relative to 1, as
    lookahead.verify_costs), drafts are sized as our engine sizes them and `cost` sums the
    modelled verify cost of every step. A request with `topk` feeds the drafter's prediction
    table the kept path's top-k after each step (see the module docstring).
    """
    steps = drafted = accepted = tokens = 0
    seconds = cost = 0.0
    curve = CostCurve(costs) if costs is not None else None
    state = Request(drafter, sized=costs is not None) if isinstance(drafter, LookupDrafter) else None
    for request in tqdm(requests, desc=progress, disable=progress is None, leave=False):
        output, topk, prompt_len = request.output, request.topk, request.prompt.shape[0]
        if not isinstance(drafter, LookupDrafter):
            state = Request(drafter(), sized=costs is not None)
        state.start(request.prompt)  # per-request setup: not a step's cost
        sequence = np.concatenate([request.prompt, output]) if topk is not None else None  # (prompt_len + output_len,)
        pos = 0
        while pos < output.shape[0]:
            start = time.perf_counter()
            room = output.shape[0] - pos - 1  # draft tokens that fit: the step's own token takes the last place
            draft = state.plan(room, curve, tree=tree, max_tree_nodes=max_tree_nodes).draft
            seconds += time.perf_counter() - start
            kept = _kept_on_tree(draft, output, pos) if tree else kept_prefix(draft.token_ids, output, pos)
            step = kept + 1  # the model's own token after the kept prefix
            if curve is not None:
                cost += float(curve.cost(1, len(draft) + 1))
            predicted = None
            if topk is not None:  # the kept path's block entries (positions in sequence): the last own token, the kept drafted ones
                entries = np.arange(max(prompt_len + pos - 1, 0), prompt_len + pos + kept)
                predicted = (sequence[entries], topk[entries])
            start = time.perf_counter()
            state.verified(output[pos : pos + step], predicted=predicted)
            seconds += time.perf_counter() - start
            steps, drafted, accepted, tokens, pos = steps + 1, drafted + len(draft), accepted + kept, tokens + step, pos + step
    return dict(steps=steps, drafted=drafted, accepted=accepted, tokens=tokens, seconds=seconds, cost=cost)


def parse_costs(spec: str) -> np.ndarray:
    """A verify-cost curve: "flat" (every block costs one step) or relative costs at block sizes
    1,2,4,8,16,32,64 ("1,1.13,1.44,1.75,2.34,2.72,3.49"); linear in between (sizing.cost_curve)."""
    if spec == "flat":
        return cost_curve([1.0] * len(SIZES))
    try:
        return cost_curve([float(x) for x in spec.split(",")])
    except ValueError:
        raise ValueError(f"--costs must be 'flat' or {len(SIZES)} finite positive numbers starting at 1 (costs at sizes "
                         f"{','.join(map(str, SIZES))}), got {spec!r}") from None


def replay_hf(requests, *, num_draft_tokens: int, ngram: int, costs: np.ndarray | None = None, progress: str | None = None) -> dict:
    """The same replay through transformers' PromptLookupCandidateGenerator, called as is
    (its drafts unsized: `costs` only prices them)."""
    import torch
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    steps = drafted = accepted = tokens = 0
    seconds = cost = 0.0
    for request in tqdm(requests, desc=progress, disable=progress is None, leave=False):
        full = torch.from_numpy(np.concatenate([request.prompt, request.output]))[None]
        prompt_len, output = request.prompt.shape[0], request.output
        generator = PromptLookupCandidateGenerator(
            num_output_tokens=num_draft_tokens, max_matching_ngram_size=ngram, max_length=full.shape[1]
        )
        pos = 0
        while pos < output.shape[0]:
            start = time.perf_counter()
            candidates, _ = generator.get_candidates(full[:, : prompt_len + pos])
            seconds += time.perf_counter() - start
            draft = candidates[0, prompt_len + pos :].numpy()[: output.shape[0] - pos - 1]
            kept = kept_prefix(draft, output, pos)
            step = kept + 1
            cost += costs[draft.shape[0] + 1] if costs is not None else 0.0
            steps, drafted, accepted, tokens, pos = steps + 1, drafted + draft.shape[0], accepted + kept, tokens + step, pos + step
    return dict(steps=steps, drafted=drafted, accepted=accepted, tokens=tokens, seconds=seconds, cost=cost)


def kept_prefix(draft: np.ndarray, output: np.ndarray, pos: int) -> int:
    """Drafted tokens greedy verification keeps: the longest prefix equal to output[pos:]."""
    agree = draft == output[pos : pos + draft.shape[0]]
    return draft.shape[0] if agree.all() else int(agree.argmin())


def _kept_on_tree(draft, output: np.ndarray, pos: int) -> int:
    """Length of the longest root path of the draft tree that output[pos:] follows."""
    node, kept = -1, 0
    tokens, parents = draft.token_ids.tolist(), draft.parents.tolist()
    while pos + kept < output.shape[0]:
        want = int(output[pos + kept])
        child = next((i for i in range(len(tokens)) if parents[i] == node and tokens[i] == want), None)
        if child is None:
            break
        node, kept = child, kept + 1
    return kept


def replay_recorded(requests) -> dict | None:
    """Steps the recorded vLLM n-gram acceptance took; None if a request lacks it. The trace records how many
    tokens each step produced, not what was drafted or how long drafting took: `drafted` and `seconds` are None."""
    steps = tokens = 0
    for request in requests:
        if request.recorded_acc_len is None:
            return None
        pos, n = 0, request.output.shape[0]
        while pos < n:
            step = min(int(request.recorded_acc_len[pos]), n - pos)
            pos += step
            steps += 1
            tokens += step
    return dict(steps=steps, drafted=None, accepted=tokens - steps, tokens=tokens, seconds=None)


def result(file: str, drafter: str, counts: dict) -> ReplayResult:
    steps = counts["steps"]
    return ReplayResult(
        file=file,
        drafter=drafter,
        tau=round(counts["tokens"] / steps, 4) if steps else 0.0,
        steps=steps,
        tokens=counts["tokens"],
        drafted=counts["drafted"],
        accepted=counts["accepted"],
        us_per_step=None if counts["seconds"] is None else round(counts["seconds"] / steps * 1e6, 2) if steps else 0.0,
        speedup=round(counts["tokens"] / counts["cost"], 4) if counts.get("cost") else None,
    )
