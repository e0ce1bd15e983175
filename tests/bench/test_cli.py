"""`lookahead replay` and `lookahead bench`: parsing, output formats, error paths."""

import argparse
import json
import sys
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest

from lookahead import LookupDrafter
from lookahead.bench.blend import timed_methods
from lookahead.bench.cli import NOT_RECORDED, RECORDED, TRACE_DOC, build_parser, main
from lookahead.bench.replay import load_trace, replay_hf, replay_lookahead, replay_recorded
from tests.models import SHARED, tiny_model

ROOT = Path(__file__).resolve().parents[2]


def write_trace(tmp_path, rows, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


REPEATING = {"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "generated_token_ids": [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]}


def test_replay_counts_equal_a_hand_simulation(tmp_path):
    requests = load_trace(write_trace(tmp_path, [REPEATING]))
    counts = replay_lookahead(requests, LookupDrafter(num_draft_tokens=4, min_ngram=1, max_ngram=2, draft_factor=4))
    # step 1: [8] never occurred before -> no draft, the model writes 9.
    # step 2: [9] never occurred before -> no draft, the model writes 1.
    # step 3: [9, 1] no, [1] yes -> draft [2, 3, 4, 5], all kept, + 6.
    # step 4: [5, 6] -> draft [7, 8, 9, 1] (4 = the budget left minus one), all kept, + 2.
    assert counts["tokens"] == 12
    assert counts["steps"] == 4
    assert counts["accepted"] == 8


def test_replay_json_output_and_recorded_reference_row(tmp_path, capsys):
    row = dict(REPEATING, acc_ngram={"acc_len": [1] * 12})
    path = write_trace(tmp_path, [row, row])
    assert main(["replay", str(path), "--json", "--num-draft-tokens", "4"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert [r["drafter"] for r in results] == ["lookahead k=4 ngram=1..8 factor=16", "vllm-ngram (recorded)"]
    assert set(results[0]) == {"file", "drafter", "tau", "steps", "tokens", "drafted", "accepted", "us_per_step", "speedup"}
    assert results[0]["speedup"] is None  # no --costs
    assert results[1]["tau"] == 1.0
    assert results[0]["tau"] > 1.0


def test_replay_hf_drafter_runs_transformers_prompt_lookup(tmp_path, capsys):
    path = write_trace(tmp_path, [REPEATING])
    assert main(["replay", str(path), "--drafter", "hf", "--hf-ngram", "2", "--num-draft-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "hf k=4 ngram=2" in out


@pytest.mark.parametrize(
    "rows, message",
    [
        ([], "empty file"),
        (["{not json"], "t.jsonl:1: not JSON"),
        ([{"prompt_token_ids": [1]}], "t.jsonl:1: missing key 'generated_token_ids'"),
        ([REPEATING, {"prompt_token_ids": [1, "a"], "generated_token_ids": [2]}], "t.jsonl:2: 'prompt_token_ids' must be a list of integer"),
        ([{"prompt_token_ids": [1.5], "generated_token_ids": [2]}], "t.jsonl:1: 'prompt_token_ids' must be a list of integer"),
        ([{"prompt_token_ids": [-1], "generated_token_ids": [2]}], "negative"),
        (["[1, 2]"], "expected a JSON object"),
        ([REPEATING, {"prompt_token_ids": [1, 2**64], "generated_token_ids": [2]}], "t.jsonl:2: 'prompt_token_ids' holds token id 18446744073709551616"),
        ([{"prompt_token_ids": [1], "generated_token_ids": [2, 2**31]}], "t.jsonl:1: 'generated_token_ids' holds token id 2147483648"),
        ([{"prompt_token_ids": [2**31 - 1], "generated_token_ids": [2]}], "t.jsonl:1: 'prompt_token_ids' holds token id 2147483647"),
    ],
)
def test_replay_bad_input_names_file_and_line(tmp_path, capsys, rows, message):
    path = write_trace(tmp_path, rows) if rows else (tmp_path / "t.jsonl")
    if not rows:
        path.write_text("")
    assert main(["replay", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_replay_missing_file(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.parametrize("option, value", [("--num-draft-tokens", "0"), ("--limit", "-1"), ("--limit", "0")])
def test_replay_bad_option(tmp_path, capsys, option, value):
    assert main(["replay", str(write_trace(tmp_path, [REPEATING])), option, value]) == 2
    assert option in capsys.readouterr().err


@pytest.mark.skipif(not (SHARED / "traces").is_dir(), reason="../shared/traces is absent")
def test_replay_on_real_traces_beats_the_recorded_vllm_ngram_and_hf_is_reproduced():
    requests = load_trace(SHARED / "traces" / "instructcoder.dev.jsonl")[:40]
    ours = replay_lookahead(requests, LookupDrafter(num_draft_tokens=16))
    hf = replay_hf(requests, num_draft_tokens=16, ngram=3)
    vllm = replay_recorded(requests)
    assert ours["tokens"] == hf["tokens"] == vllm["tokens"] == sum(r.output.shape[0] for r in requests)
    assert ours["tokens"] / ours["steps"] > vllm["tokens"] / vllm["steps"]


def test_replay_with_costs_reports_a_modelled_speedup(tmp_path, capsys):
    path = write_trace(tmp_path, [REPEATING, REPEATING])
    assert main(["replay", str(path), "--json", "--costs", "flat"]) == 0
    flat = json.loads(capsys.readouterr().out)["results"][0]
    assert flat["speedup"] == flat["tau"]  # every block costs one plain step
    steep = "1,2,3,4,5,6,7"
    assert main(["replay", str(path), "--json", "--costs", steep]) == 0
    sized = json.loads(capsys.readouterr().out)["results"][0]
    assert 0 < sized["speedup"] < sized["tau"]
    assert sized["drafted"] < flat["drafted"]  # dear blocks: shorter drafts
    assert main(["replay", str(path), "--json", "--costs", steep, "--drafter", "hf"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["speedup"] > 0


@pytest.mark.parametrize("spec", ["1,2", "2,2,3,4,5,6,7", "1,nan,2,4,5,6,7", "1,1,1,1,1,1,-2", "steep"])
def test_replay_bad_costs_are_refused(tmp_path, capsys, spec):
    assert main(["replay", str(write_trace(tmp_path, [REPEATING])), "--costs", spec]) == 2
    assert "--costs" in capsys.readouterr().err


def test_bench_overhead_quick_json(capsys):
    assert main(["bench", "--overhead", "--quick", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["overhead"]
    ours = [r for r in rows if r["drafter"] == "lookahead"]
    assert [r["context"] for r in ours] == [1000, 8000, 32000]
    assert all(0 < r["bytes_per_token"] <= 64 for r in ours)


def test_bench_refuses_prompts_without_model(tmp_path, capsys):
    assert main(["bench", "--prompts", str(write_trace(tmp_path, [{"prompt": "hi"}]))]) == 2
    assert "--prompts needs --model" in capsys.readouterr().err


def test_bench_forced_model_is_exact_on_a_tiny_shape(monkeypatch, capsys):
    # The full pipeline (workloads, tokenizer, forced random model, all methods) on a small shape.
    from lookahead.bench import traces

    monkeypatch.setattr(traces, "DEFAULT_SHAPE", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    assert main(["bench", "--requests", "1", "--max-new-tokens", "40", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert {r["workload"] for r in rows} == {"code-edit", "summarize", "chat"}
    assert all(r["exact"] for r in rows)
    code = {r["method"]: r for r in rows if r["workload"] == "code-edit"}
    assert code["greedy"]["tau"] == pytest.approx(41 / 41, rel=0.05)  # one token per forward (prefill included)
    assert code["hf prompt lookup k=16"]["tau"] > 2  # the edited file is mostly copied
    assert set(code) == {"greedy", "hf prompt lookup k=16", "lookahead assistant_model", "lookahead.generate"}


def test_replay_tree_keeps_at_least_what_the_chain_keeps(tmp_path, capsys):
    rng = np.random.default_rng(0)
    rows = [{"prompt_token_ids": rng.integers(0, 5, 200).tolist(), "generated_token_ids": rng.integers(0, 5, 100).tolist()} for _ in range(3)]
    path = write_trace(tmp_path, rows)
    taus = {}
    for flags in ([], ["--tree"], ["--no-memory"]):
        assert main(["replay", str(path), "--json", *flags]) == 0
        (result,) = json.loads(capsys.readouterr().out)["results"]
        taus[" ".join(flags)] = result["tau"]
        assert ("tree<=64" in result["drafter"]) == ("--tree" in flags)
        assert ("no-memory" in result["drafter"]) == ("--no-memory" in flags)
    assert taus["--tree"] >= taus[""]


def test_replay_bad_max_tree_nodes(tmp_path, capsys):
    assert main(["replay", str(write_trace(tmp_path, [REPEATING])), "--tree", "--max-tree-nodes", "0"]) == 2
    assert "--max-tree-nodes" in capsys.readouterr().err


@pytest.fixture
def no_benchmark(monkeypatch):
    """Fails the test if the benchmark itself starts: refusals must come first."""
    from lookahead.bench import e2e

    def ran(*args, **kwargs):
        raise AssertionError("the benchmark ran before the bad option was refused")

    monkeypatch.setattr(e2e, "bench_model", ran)


@pytest.mark.parametrize("flags", [["--quick", "--requests", "0"], ["--requests", "-2"], ["--quick", "--max-new-tokens", "0"]])
def test_bench_refuses_bad_counts_even_with_quick(capsys, no_benchmark, flags):
    # A regression: --quick overwrote --requests 0 with 1 and ran, exit 0.
    assert main(["bench", *flags]) == 2
    assert "--requests and --max-new-tokens must be >= 1" in capsys.readouterr().err


def test_bench_unloadable_model_is_one_clear_line(tmp_path, capsys, no_benchmark):
    # A regression: 75 lines of transformers' tracebacks.
    assert main(["bench", "--model", str(tmp_path / "nonexistent")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lookahead bench: error: --model {tmp_path / 'nonexistent'}: cannot load it (")
    assert len(err.strip().splitlines()) == 1


def test_bench_plot_without_matplotlib_is_refused_before_running(monkeypatch, capsys, no_benchmark):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["bench", "--quick", "--plot", "chart.png"]) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err


def test_replay_imports_neither_torch_nor_transformers(tmp_path):
    # `lookahead replay` is model-free; loading torch and transformers took it from ~1 s to ~13 s on a loaded machine.
    import subprocess

    path = write_trace(tmp_path, [REPEATING])
    code = ("import sys; from lookahead.bench.cli import main; assert main(['replay', sys.argv[1], '--json']) == 0; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_bench_blend_needs_a_model_and_reports_every_source(capsys):
    assert main(["bench", "--blend"]) == 2
    assert "--blend runs a real model" in capsys.readouterr().err
    stories = SHARED / "models" / "stories260K"
    if not stories.is_dir():
        pytest.skip(f"{stories} is absent")
    assert main(["bench", "--blend", "--model", str(stories), "--requests", "2", "--max-new-tokens", "12", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["tau"]
    assert len(rows) == 2 * 2 * 2 * 3  # sampling x drafter kept or fresh x chain or tree x source
    assert {r["source"] for r in rows} == {"lookup", "table", "blend"} and all(r["tau"] >= 1.0 for r in rows)
    assert main(["bench", "--blend", "--time-blend", "--model", str(stories), "--requests", "2", "--max-new-tokens", "12",
                 "--dtype", "float32,bfloat16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    tpot = report["tpot"]
    assert "tau" not in report  # timing only
    assert [(r["dtype"], r["sampling"], r["drafter"], r["source"]) for r in tpot] == [
        (d, s, kept, m) for d in ("float32", "bfloat16") for s in ("greedy", "sampled t=0.8") for kept in ("fresh", "kept")
        for m in ("plain", "lookup (default drafter)", "blend (default drafter)")]
    assert all(r["ms_per_token"] > 0 and r["over_plain_min"] <= r["over_plain_max"] for r in tpot)
    assert all(r["tau"] >= 1.0 for r in tpot) and all(r["tau"] == 1.0 and r["over_plain_max"] == 1.0 for r in tpot[::3])
    assert all(r["over_lookup_max"] == 1.0 for r in tpot[1::3])
    assert main(["bench", "--blend", "--time-blend", "--model", str(stories), "--requests", "1", "--max-new-tokens", "8",
                 "--methods", "blend", "--json"]) == 0  # lookup, the baseline, always among them
    tpot = json.loads(capsys.readouterr().out)["tpot"]
    assert {r["source"] for r in tpot} == {"lookup (default drafter)", "blend (default drafter)"} and "over_plain_min" not in tpot[0]
    assert main(["bench", "--blend", "--time-blend", "--model", str(stories), "--requests", "1", "--max-new-tokens", "8",
                 "--methods", "unsized", "--json"]) == 0  # the blend's whole trees, every node verified
    tpot = json.loads(capsys.readouterr().out)["tpot"]
    assert [r["source"] for r in tpot[:2]] == ["lookup (default drafter)", "blend unsized (whole trees)"] and tpot[1]["tau"] >= 1.0
    with pytest.raises(ValueError, match="plain, lookup, blend and unsized"):
        timed_methods("greedy")


def test_forward_cost_sleeps_per_forward_on_one_thread_and_undoes_itself(capsys):
    import torch

    from lookahead.bench.blend import forward_cost
    from tests.models import tiny_model

    model = tiny_model("llama")
    slept = []
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the tests run at one (tests/conftest.py): two, so that dropping to one and back shows
    try:
        with patch("lookahead.bench.blend.time.sleep", slept.append), forward_cost(model, 2.0, 0.5):
            assert torch.get_num_threads() == 1
            model(torch.tensor([[1, 2, 3, 4]]))
            model(input_ids=torch.tensor([[1, 2]]))
        model(torch.tensor([[1]]))  # the hook is gone
        assert slept == [pytest.approx(0.004), pytest.approx(0.003)] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(SystemExit):
        main(["bench", "--blend", "--time-blend", "--forward-cost", "20"])
    assert "MS,MS_PER_TOKEN" in capsys.readouterr().err


def subcommands() -> dict:
    """`lookahead`'s subparsers by name."""
    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_flag_has_help(command):
    subparser = subcommands()[command]
    missing = [a.option_strings or a.dest for a in subparser._actions if not a.help or a.help == argparse.SUPPRESS]
    assert not missing, f"lookahead {command}: no help for {missing}"
    [commands] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert all(choice.help for choice in commands._choices_actions)  # each command's line in `lookahead --help`


def test_bench_flags_are_grouped_by_topic():
    bench = subcommands()["bench"]
    groups = {g.title: [a.option_strings[0] for a in g._group_actions] for g in bench._action_groups}
    assert {"workload", "methods", "timing", "other measurements", "output"} <= set(groups)
    assert groups["options"] == ["-h"], f"bench flags outside a group: {groups['options']}"
    assert "--model" in groups["workload"] and "--methods" in groups["methods"] and "--quick" in groups["timing"]
    assert "--batch" in groups["other measurements"] and "--json" in groups["output"]


def test_help_is_written_for_users_and_its_examples_parse(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "import" not in text and "torch-free" not in text and ".py" not in text, text
    assert (ROOT / TRACE_DOC).is_file()
    for command in subcommands():
        assert f"lookahead {command} " in text  # an example of each command
        with pytest.raises(SystemExit):
            main([command, "--help"])
        page = capsys.readouterr().out
        assert "lookahead/bench/replay.py" not in page, f"lookahead {command} --help points at code, not {TRACE_DOC}"
        examples = [line.split("#")[0].split() for line in (text + page).splitlines() if line.strip().startswith(f"lookahead {command} ")]
        assert examples, command
        for argv in examples:
            build_parser().parse_args(argv[1:])  # every example is a valid command line


def test_replay_table_shows_no_figures_a_recorded_reference_does_not_hold(tmp_path, capsys):
    row = dict(REPEATING, acc_ngram={"acc_len": [2] * 12})
    path = write_trace(tmp_path, [row])
    assert main(["replay", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    cells = lambda line: [c.strip() for c in line.strip("|").split("|")]  # noqa: E731
    header = cells(lines[0])
    [recorded] = [cells(line) for line in lines if RECORDED in line and line.startswith("|")]
    assert recorded[header.index("drafted")] == NOT_RECORDED and recorded[header.index("us/step")] == NOT_RECORDED, recorded
    assert recorded[header.index("steps")] == "6" and recorded[header.index("accepted")] == "6"  # what the trace does hold
    assert any(line.startswith(f"{RECORDED}:") for line in lines)  # a line says what the row is
    assert main(["replay", str(path), "--json"]) == 0
    recorded = json.loads(capsys.readouterr().out)["results"][1]
    assert recorded["drafted"] is None and recorded["us_per_step"] is None


def test_quick_is_the_smallest_comparison(monkeypatch, capsys):
    """--quick's configuration (not its time): two workloads, one short request each, the small shape, three methods."""
    from lookahead.bench import e2e, traces

    assert e2e.QUICK["requests"] == 1 and e2e.QUICK["max_new_tokens"] <= 64
    assert set(e2e.QUICK["workloads"]) == {"code-edit", "chat"}  # one where lookup pays, one with little to copy
    assert e2e.QUICK["methods"][:2] == ("greedy", e2e.PLD) and len(e2e.QUICK["methods"]) == 3
    quick = argparse.Namespace(quick=True, shape=None)
    assert traces.shape_for(quick) is traces.QUICK_SHAPE and traces.QUICK_SHAPE["num_hidden_layers"] <= 8
    ran = {}

    def bench_model(model, tasks, methods, **kwargs):
        ran.update(tasks=tasks, methods=[name for name, _ in methods])
        return []

    monkeypatch.setattr(e2e, "bench_model", bench_model)
    monkeypatch.setattr(e2e, "build_model", lambda shape, **kwargs: ran.update(shape=shape) or tiny_model("qwen2"))
    assert main(["bench", "--quick", "--json"]) == 0
    assert ran["shape"] is traces.QUICK_SHAPE
    assert ran["methods"] == list(e2e.QUICK["methods"])
    assert list(ran["tasks"]) == list(e2e.QUICK["workloads"])
    assert all(len(tasks) == 1 and tasks[0].max_new_tokens <= e2e.QUICK["max_new_tokens"] + 1  # + the reference's EOS
               for tasks in ran["tasks"].values())
    assert json.loads(capsys.readouterr().out)["max_new_tokens"] == e2e.QUICK["max_new_tokens"]
