"""`lookahead bench`: the timing pipeline on trace files, at a tiny shape (correctness only, nothing timed)."""

import json
import re
import time

import numpy as np
import pytest
import torch

from lookahead.bench import e2e, traces
from lookahead.bench.cli import main
from lookahead.sizing.cost import LoopCosts

TINY_SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
VOCAB = 50
CORE = ["greedy", "hf prompt lookup k=16", "lookahead assistant_model", "lookahead.generate"]


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(traces, "DEFAULT_SHAPE", TINY_SHAPE)


def write_traces(tmp_path, name="a.jsonl", requests=3, seed=0, end=49):
    """Requests whose outputs copy their prompts in part (drafts get accepted), each ending with `end`."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(requests):
        prompt = rng.integers(0, 40, 60).tolist()
        output = prompt[10:40] + rng.integers(0, 40, 10).tolist() + prompt[5:25] + [end]
        rows.append({"id": "x", "prompt_token_ids": prompt, "generated_token_ids": output})
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def run_json(capsys, *argv):
    code = main(["bench", *argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def test_traces_bench_rows_are_complete_and_exact_in_both_dtypes(tiny, tmp_path, capsys):
    a, b = write_traces(tmp_path, "a.jsonl"), write_traces(tmp_path, "b.jsonl", requests=2, seed=1)
    code, out, _ = run_json(capsys, "--traces", str(a), str(b), "--vocab-size", str(VOCAB), "--requests", "2", "--max-new-tokens", "40")
    assert code == 0
    assert out["dtypes"] == ["float32", "bfloat16"]  # the default with --traces
    assert set(out["tree_none"]) == {"float32", "bfloat16"}  # what lookahead.generate's tree=None drafted, per dtype
    for choice in out["tree_none"].values():  # a family with trees: decided by the ratio its tree steps measured
        if choice["tree_over_chain"] is None:
            assert choice["drafts"] == "undecided", choice
        else:
            limit = max(LoopCosts.TREE_MAX_OVER_CHAIN, min(choice["tree_gain"], LoopCosts.TREE_MAX_PROMISED))
            assert (choice["drafts"] == "trees") == (choice["tree_over_chain"] <= limit), choice
    rows = out["results"]
    assert [(r["file"], r["dtype"], r["method"]) for r in rows] == [
        (f, d, m) for d in ("float32", "bfloat16") for f in ("a.jsonl", "b.jsonl") for m in CORE
    ]
    for r in rows:
        assert set(r) == {"file", "dtype", "method", "tokens_per_s", "speedup", "vs_pld", "decode_speedup", "decode_vs_pld", "tau", "exact",
                          "tokens", "requests", "seconds", "ttft_ms", "tpot_ms"}
        assert r["exact"], r
        assert r["tokens"] == 2 * 40  # two requests, each cut at 40 tokens (its EOS lies beyond)
        assert r["tokens_per_s"] > 0
    by = {(r["file"], r["dtype"], r["method"]): r for r in rows}
    for f in ("a.jsonl", "b.jsonl"):
        for d in ("float32", "bfloat16"):
            assert by[f, d, "greedy"]["speedup"] == 1.0
            assert by[f, d, "hf prompt lookup k=16"]["vs_pld"] == 1.0
            assert by[f, d, "greedy"]["tau"] == 1.0  # one token per forward pass, prefill included
            assert by[f, d, "hf prompt lookup k=16"]["tau"] > 1.5  # counted the same way: the outputs copy 20-30 tokens
            # (ours are sized by this process's timing calibration, noisy on a loaded machine: not asserted)


def test_traces_eos_is_the_recorded_end_and_cut_references_run_to_the_cut(tiny, tmp_path, capsys):
    # 45 closes each output and occurs nowhere before, so the whole output runs when it fits.
    path = write_traces(tmp_path, end=45)
    code, out, _ = run_json(capsys, "--traces", str(path), "--vocab-size", str(VOCAB), "--dtype", "float32", "--max-new-tokens", "1000")
    assert code == 0
    assert {r["tokens"] for r in out["results"]} == {3 * 61}


def test_forced_trace_task_stops_at_the_first_recorded_eos():
    from lookahead.bench.replay import TraceRequest

    request = TraceRequest(np.array([1, 2]), np.array([5, 9, 6, 9]), None)
    task = traces.forced_trace_task(request, max_new_tokens=10)
    assert (task.reference, task.eos_token_id, task.max_new_tokens) == ([5, 9], 9, 2)
    assert traces.forced_trace_task(request, max_new_tokens=1).reference == [5]


def test_repeats_report_spread_and_variants_run(tiny, tmp_path, capsys):
    path = write_traces(tmp_path, requests=1)
    code, out, _ = run_json(capsys, "--traces", str(path), "--vocab-size", str(VOCAB), "--dtype", "bfloat16", "--max-new-tokens", "24",
                            "--repeats", "2", "--variants")
    assert code == 0
    rows = out["results"]
    assert len(rows) == len(e2e.methods(variants=True)) > len(CORE)
    for r in rows:
        assert r["exact"], r
        assert r["speedup_min"] <= r["speedup_max"] and r["vs_pld_min"] <= r["vs_pld_max"]


def test_repeats_time_each_request_by_its_fastest_run():
    def run(greedy, pld, ours):  # seconds per request; 10 tokens per request, the first after 0.1 s
        return {name: dict(request_seconds=seconds, request_first_token_s=[0.1] * len(seconds), tokens=10 * len(seconds),
                           forwards=len(seconds), exact=True)
                for name, seconds in (("greedy", greedy), (e2e.PLD, pld), ("ours", ours))}

    # run 1 stalled ours' first request, run 2 greedy's second: neither stall counts
    row = e2e.wall_clock_summary([run([1.0, 1.0], [2.0, 2.0], [9.0, 0.5]), run([1.0, 7.0], [2.0, 2.0], [0.5, 0.5])], "ours")
    assert row["tokens_per_s"] == pytest.approx(20 / 1.0)
    assert row["speedup"] == pytest.approx(2.0) and row["vs_pld"] == pytest.approx(4.0)
    assert (row["speedup_min"], row["speedup_max"]) == (round(2 / 9.5, 3), 8.0)  # the runs' own ratios
    # decoding: 18 tokens after the first in 1.0 - 0.2 s (ours), 2.0 - 0.2 (greedy), 4.0 - 0.2 (PLD)
    assert row["ttft_ms"] == pytest.approx(100.0) and row["tpot_ms"] == pytest.approx(800 / 18)
    assert row["decode_speedup"] == pytest.approx(1.8 / 0.8, abs=1e-3) and row["decode_vs_pld"] == pytest.approx(3.8 / 0.8, abs=1e-3)
    assert row["ttft_ms"] * row["requests"] + row["tpot_ms"] * (row["tokens"] - row["requests"]) == pytest.approx(row["seconds"] * 1e3)


def test_methods_take_turns_starting_in_rotation_and_exactness_is_against_greedy(monkeypatch):
    from lookahead.bench.timing import Timing

    calls = []

    def fake(model, task, options, *, forward_time=False):
        calls.append(options["name"])
        out = task.prompt + ([7] if options["name"] == "bad" else [5])  # greedy writes 5
        return out, Timing(seconds=1.0, first_token_s=0.5, forwards=1, forward_s=None)

    monkeypatch.setattr(e2e, "generate_task", fake)
    methods = [(name, (lambda name: lambda: {"name": name})(name)) for name in ("greedy", "a", "bad")]
    tasks = [traces.Task([1, 2], None, None, 1) for _ in range(4)]
    totals = e2e.time_methods(None, tasks, methods, turn=1)
    assert calls == ["a", "bad", "greedy", "bad", "greedy", "a", "greedy", "a", "bad", "a", "bad", "greedy"]
    assert totals["greedy"]["exact"] and totals["a"]["exact"] and not totals["bad"]["exact"]  # greedy's output, whenever it ran


def test_one_drafter_per_method_serves_all_of_a_files_requests(tiny, tmp_path, monkeypatch):
    from lookahead import LookupDrafter

    made = []
    real = e2e.methods

    def counting(**kwargs):
        return [(name, (lambda name, make: lambda: made.append(name) or make())(name, make)) for name, make in real(**kwargs)]

    monkeypatch.setattr(e2e, "methods", counting)
    resets = []
    monkeypatch.setattr(LookupDrafter, "reset", (lambda reset: lambda self, *a, **k: resets.append(id(self)) or reset(self, *a, **k))(LookupDrafter.reset))
    path = write_traces(tmp_path, requests=3)
    assert main(["bench", "--traces", str(path), "--vocab-size", str(VOCAB), "--dtype", "float32", "--max-new-tokens", "20", "--json"]) == 0
    timed = made[len(CORE):]  # after one warm-up call per method
    assert timed == CORE  # built once for the file's three requests
    ours = resets[-6:]  # the timed requests' resets: two drafters, three requests each
    assert len(set(ours)) == 2 and all(ours.count(i) == 3 for i in set(ours))


def test_table_output_names_the_caption_and_every_method(tiny, tmp_path, capsys):
    path = write_traces(tmp_path, requests=1)
    assert main(["bench", "--traces", str(path), "--vocab-size", str(VOCAB), "--dtype", "float32", "--max-new-tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert "prefill included" in out and "vs PLD k=16" in out
    assert re.search(r"tree=None \(lookahead.generate's default\) drafted (trees|chains|undecided) in float32", out)
    assert all(m in out for m in CORE)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--vocab-size", "40"], "t.jsonl: request 1 holds token id"),
        (["--requests", "0"], "--requests"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--repeats", "0"], "--repeats"),
        (["--dtype", "float16"], "--dtype takes float32, bfloat16, auto"),
        (["--dtype", "float32,fp8"], "--dtype takes"),
        (["--vocab-size", "1"], "--vocab-size must be >= 2"),
    ],
)
def test_bad_bench_input_is_refused_in_one_line(tmp_path, capsys, argv, message):
    path = write_traces(tmp_path, "t.jsonl")
    assert main(["bench", "--traces", str(path), *(["--vocab-size", str(VOCAB)] if "--vocab-size" not in argv else []), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("argv", [[], ["--model", "unused"]])
def test_vocab_size_is_refused_where_it_would_be_ignored(tmp_path, capsys, argv):
    extra = ["--traces", str(write_traces(tmp_path))] if argv else []
    assert main(["bench", "--vocab-size", "100", *argv, *extra]) == 2
    assert "--vocab-size sets the forced model's vocabulary with --traces" in capsys.readouterr().err


def test_batch_bench_rows_are_exact_per_batch_size_and_dtype(tiny, tmp_path, capsys):
    a, b = write_traces(tmp_path, "a.jsonl", requests=3), write_traces(tmp_path, "b.jsonl", requests=2, seed=1)
    code, out, _ = run_json(capsys, "--batch", "1,4", "--traces", str(a), str(b), "--vocab-size", str(VOCAB), "--max-new-tokens", "30",
                            "--repeats", "2")
    assert code == 0
    rows = out["results"]
    methods = {1: ["plain batched greedy", "lookahead.generate", "hf prompt lookup k=16"], 4: ["plain batched greedy", "lookahead.generate"]}
    assert [(r["batch"], r["dtype"], r["method"]) for r in rows] == [
        (size, d, m) for d in ("float32", "bfloat16") for size in (1, 4) for m in methods[size]
    ]
    by = {(r["batch"], r["dtype"], r["method"]): r for r in rows}
    for r in rows:
        assert r["exact"], r
        assert r["tokens"] == r["batch"] * 30 and r["longest_row_tokens"] == 30  # every row cut at 30 tokens (its EOS lies beyond)
        assert 0 < r["ttft_ms"] < r["seconds"] * 1e3
        assert r["ttft_ms"] + r["tpot_ms"] * (r["longest_row_tokens"] - 1) == pytest.approx(r["seconds"] * 1e3)
        assert (r["vs_pld"] is None) == (r["decode_vs_pld"] is None) == (r["batch"] > 1)  # prompt lookup runs one row only
    for d in ("float32", "bfloat16"):
        for size in (1, 4):
            plain = by[size, d, "plain batched greedy"]
            assert plain["forwards"] == 30  # one per token, prefill included
            assert plain["speedup"] == plain["decode_speedup"] == 1.0
            assert by[size, d, "lookahead.generate"]["forwards"] < 30  # drafts kept: the outputs copy their prompts
        assert by[1, d, "hf prompt lookup k=16"]["vs_pld"] == by[1, d, "hf prompt lookup k=16"]["decode_vs_pld"] == 1.0
        assert by[1, d, "hf prompt lookup k=16"]["forwards"] < 30


def test_batch_bench_skips_without_traces_and_refuses_bad_sizes(tmp_path, capsys, monkeypatch):
    from lookahead.bench import traces

    monkeypatch.setattr(traces, "SHARED_TRACES", tmp_path / "absent")  # where every trace mode looks (traces.trace_paths)
    assert main(["bench", "--batch", "1,4"]) == 0
    assert "skipped" in capsys.readouterr().err
    assert main(["bench", "--batch", "0,4"]) == 2
    assert "--batch takes a comma list" in capsys.readouterr().err
    assert main(["bench", "--batch", "4", "--traces", str(write_traces(tmp_path)), "--vocab-size", str(VOCAB)]) == 2
    assert "needs 4 requests" in capsys.readouterr().err


def test_traces_bench_decode_times_add_up_to_the_wall_clock(tiny, tmp_path, capsys):
    path = write_traces(tmp_path, requests=2)
    code, out, _ = run_json(capsys, "--traces", str(path), "--vocab-size", str(VOCAB), "--dtype", "float32", "--max-new-tokens", "30")
    assert code == 0
    by = {r["method"]: r for r in out["results"]}
    for r in by.values():
        assert r["requests"] == 2 and 0 < r["ttft_ms"] * r["requests"] < r["seconds"] * 1e3
        assert r["ttft_ms"] * r["requests"] + r["tpot_ms"] * (r["tokens"] - r["requests"]) == pytest.approx(r["seconds"] * 1e3)
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"], rel=1e-3)
    assert by["greedy"]["decode_speedup"] == 1.0 and by[e2e.PLD]["decode_vs_pld"] == 1.0
    ours = by["lookahead.generate"]
    greedy_tpot = by["greedy"]["tpot_ms"]
    assert ours["decode_speedup"] == pytest.approx(greedy_tpot / ours["tpot_ms"], abs=1e-3)


def test_prompt_lookups_steps_in_the_bench_equal_replay_hf(tiny, tmp_path, capsys):
    # Forcing in the forward hands transformers' prompt lookup no processor to filter its
    # candidates with: its forward passes are exactly the model-free replay's steps.
    from lookahead.bench.replay import TraceRequest, load_trace, replay_hf

    path = write_traces(tmp_path, requests=3)
    code, out, _ = run_json(capsys, "--traces", str(path), "--vocab-size", str(VOCAB), "--dtype", "float32", "--max-new-tokens", "40",
                            "--methods", f"greedy,{e2e.PLD}")
    assert code == 0
    pld = next(r for r in out["results"] if r["method"] == e2e.PLD)
    tasks = [traces.forced_trace_task(r, 40) for r in load_trace(path)]
    replayed = replay_hf([TraceRequest(np.array(t.prompt), np.array(t.reference), None) for t in tasks], num_draft_tokens=16, ngram=3)
    assert pld["tokens"] == replayed["tokens"]
    assert pld["tau"] == round(replayed["tokens"] / replayed["steps"], 3)


def test_force_reference_lifts_one_logit_per_position_and_no_other():
    import torch

    model = traces.build_model(shape=TINY_SHAPE, vocab=VOCAB, dtype=torch.float32, device="cpu")
    prompt, reference = [3, 4, 5, 6], [7, 8, 9]
    ids = torch.tensor([prompt + reference[:2]])
    with torch.inference_mode():
        plain = model(input_ids=ids).logits[0]
        with traces.force_reference(model, len(prompt), reference):
            forced = model(input_ids=ids).logits[0]
    changed = (forced != plain).nonzero().tolist()
    assert changed == [[3, 7], [4, 8], [5, 9]]  # positions 3..5 predict reference[0..2]; the prompt's first three are left alone
    assert forced[3:].argmax(-1).tolist() == reference
    assert torch.isfinite(forced).all()  # nothing made impossible


def test_forced_options_turn_rejected_recording_off_for_our_loop_alone():
    import lookahead
    from lookahead import LookupDrafter

    ours = dict(custom_generate=lookahead.generate, assistant=LookupDrafter(), max_new_tokens=8)
    assert traces.forced_options(ours) == ours | dict(record_rejected=False) and "record_rejected" not in ours
    pld = dict(prompt_lookup_num_tokens=16, max_matching_ngram_size=3)
    assert traces.forced_options(pld) == pld


def test_methods_option_selects_and_refuses(tiny, tmp_path, capsys):
    path = write_traces(tmp_path, requests=1)
    code, out, _ = run_json(capsys, "--traces", str(path), "--vocab-size", str(VOCAB), "--dtype", "float32", "--max-new-tokens", "12",
                            "--methods", f"greedy,{e2e.PLD},lookahead.generate tree,hf prompt lookup k=10")
    assert code == 0
    assert [r["method"] for r in out["results"]] == ["greedy", e2e.PLD, "lookahead.generate tree", "hf prompt lookup k=10"]
    assert all(r["exact"] for r in out["results"])
    assert main(["bench", "--traces", str(path), "--vocab-size", str(VOCAB), "--methods", "greedy,nope"]) == 2
    assert "--methods: no method 'nope'" in capsys.readouterr().err
    assert main(["bench", "--traces", str(path), "--vocab-size", str(VOCAB), "--methods", "greedy,lookahead.generate"]) == 2
    assert "--methods must name greedy and" in capsys.readouterr().err


def test_loop_overhead_rows_add_up_and_the_compact_vocabulary_keeps_every_step(tmp_path, capsys):
    from lookahead.bench import loop_overhead
    from lookahead.bench.replay import TraceRequest, replay_hf

    a, b = write_traces(tmp_path, "a.jsonl", requests=2), write_traces(tmp_path, "b.jsonl", requests=1, seed=1)
    code, out, _ = run_json(capsys, "--loop-overhead", "--traces", str(a), str(b), "--max-new-tokens", "30", "--repeats", "2")
    assert code == 0
    rows = out["results"]
    floors = [loop_overhead.ASSISTED_FLOOR, loop_overhead.ASSISTED_REPLAY]
    assert [(r["file"], r["method"]) for r in rows] == [(f, m) for f in ("a.jsonl", "b.jsonl") for m in CORE + floors]
    tasks = {name: [traces.forced_trace_task(r, 30) for r in loaded] for name, loaded in traces.read_traces([a, b], 3, None).items()}
    distinct = {i for requests in tasks.values() for t in requests for i in t.prompt + t.reference + [t.eos_token_id]}  # 49, beyond the cut, too
    assert out["vocab"] == len(distinct)
    for r in rows:
        assert r["exact"], r
        assert r["forward_s"] + r["outside_us_per_step"] * r["forwards"] / 1e6 == pytest.approx(r["seconds"])
        assert r["outside_us_per_token"] * r["tokens"] == pytest.approx(r["outside_us_per_step"] * r["forwards"])
        assert r["tau"] == round(r["tokens"] / r["forwards"], 3)
    by = {(r["file"], r["method"]): r for r in rows}
    assert by["a.jsonl", "greedy"]["x_greedy"] == 1.0 and by["a.jsonl", e2e.PLD]["x_pld"] == 1.0
    assert by["a.jsonl", "greedy"]["forwards"] == by["a.jsonl", "greedy"]["tokens"] == 60
    assert by["a.jsonl", loop_overhead.ASSISTED_FLOOR]["forwards"] == 60  # transformers' assisted loop, one token per step
    # our drafts replayed: our steps exactly (in one run: ours sizes by its step times, so repeats may differ)
    once = {r["method"]: r for r in loop_overhead.loop_overhead([a], requests=2, max_new_tokens=30, dtype=torch.float32, device="cpu")[0]}
    assert once[loop_overhead.ASSISTED_REPLAY]["forwards"] == once["lookahead assistant_model"]["forwards"] < once["greedy"]["forwards"]
    # the ids mapped one to one: prompt lookup takes the same steps as at the traces' own ids
    compact, vocab = loop_overhead.compact_vocabulary(tasks)
    assert vocab == len(distinct) and compact["a.jsonl"][0].eos_token_id == vocab - 1  # 49, the largest id, maps to the last
    as_requests = lambda ts: [TraceRequest(np.array(t.prompt), np.array(t.reference), None) for t in ts]  # noqa: E731
    assert replay_hf(as_requests(compact["a.jsonl"]), num_draft_tokens=16, ngram=3)["steps"] == \
        replay_hf(as_requests(tasks["a.jsonl"]), num_draft_tokens=16, ngram=3)["steps"] == by["a.jsonl", e2e.PLD]["forwards"]


def test_loop_overhead_batches_are_exact_per_row_and_count_every_row_step(tmp_path, capsys):
    from lookahead.bench import loop_overhead

    a, b = write_traces(tmp_path, "a.jsonl", requests=2), write_traces(tmp_path, "b.jsonl", requests=2, seed=1, end=48)
    code, out, _ = run_json(capsys, "--loop-overhead", "--traces", str(a), str(b), "--max-new-tokens", "20", "--methods",
                            "greedy,hf prompt lookup k=16", "--rows", "1,3", "--prompt-tokens", "12")
    assert code == 0 and out["prompt_tokens"] == 12
    batches = out["batches"]
    assert [(r["batch"], r["method"]) for r in batches] == [(b, m) for b in (1, 3) for m in loop_overhead.BATCH_METHODS]
    for r in batches:
        assert r["exact"], r  # every row equal to plain batched greedy's, and through it (forced) to its reference
        assert r["forwards"] <= r["row_steps"] <= r["batch"] * r["forwards"]
        assert r["outside_us_per_row_step"] * r["row_steps"] == pytest.approx(r["outside_us_per_step"] * r["forwards"])
    plain = {r["batch"]: r for r in batches if r["method"] == "plain batched greedy"}
    assert plain[3]["row_steps"] == 3 * plain[3]["forwards"] and plain[3]["x_plain"] == 1.0
    # each row's ids a range of its own; the forcing reads the row off them, so plain greedy writes each row's reference
    tasks = [traces.forced_trace_task(r, 20) for r in traces.read_traces([a], 2, None)["a.jsonl"]]
    mapped, owner = loop_overhead.rows_vocabulary(tasks)
    assert [owner[t.prompt[0]] for t in mapped] == [0, 1] and len(owner) == sum(len(set(t.prompt + t.reference + [t.eos_token_id])) for t in tasks)
    model = traces.build_model(shape=TINY_SHAPE, vocab=len(owner) + 1, dtype=torch.float32, device="cpu")
    run = loop_overhead.run_rows(model, mapped, owner, "plain batched greedy")
    width = max(len(t.prompt) for t in mapped)
    assert [row[width : width + len(t.reference)] for row, t in zip(run["output"], mapped)] == [t.reference for t in mapped]
    assert main(["bench", "--rows", "4", "--traces", str(a)]) == 2
    assert "--rows is an option of --loop-overhead" in capsys.readouterr().err


def test_one_bench_mode_at_a_time(tmp_path, capsys):
    path = write_traces(tmp_path)
    assert main(["bench", "--loop-overhead", "--batch", "1", "--traces", str(path)]) == 2
    assert "--batch and --loop-overhead: one bench mode at a time" in capsys.readouterr().err
    assert main(["bench", "--loop-overhead", "--model", "x"]) == 2
    assert "--loop-overhead runs the forced model on trace requests" in capsys.readouterr().err


def test_long_context_material_is_other_requests_cut_to_the_size():
    from lookahead.bench import long_context
    from lookahead.bench.replay import TraceRequest

    per_file = {"a": [TraceRequest(np.array([1, 2]), np.array([3]), None), TraceRequest(np.array([4, 5]), np.array([6]), None)],
                "b": [TraceRequest(np.array([7]), np.array([8]), None), TraceRequest(np.array([9]), np.array([10, 11]), None),
                      TraceRequest(np.array([12]), np.array([13]), None)]}
    pool = long_context.material_pool(per_file, skip=1)  # the timed first request of each file is never material
    assert pool == [[4, 5, 6], [9, 10, 11], [12, 13]]
    assert long_context.material(pool, 5) == [[4, 5, 6], [9, 10]]
    assert long_context.material(pool, 0) == []
    with pytest.raises(ValueError, match="--context 9 needs 9 tokens"):
        long_context.material(pool, 9)
    with_docs = dict(long_context.context_methods([[4, 5, 6], [9, 10]]))
    assert len(with_docs["lookahead.generate"]()["assistant"].documents) == 2
    assert len(with_docs["lookahead assistant_model"]()["assistant_model"].documents) == 2
    assert with_docs["greedy"]() == {} and "assistant_model" not in with_docs[e2e.PLD]()


def test_long_context_rows_per_context_and_variant(tiny, tmp_path, capsys):
    path = write_traces(tmp_path, requests=4)
    code, out, _ = run_json(capsys, "--context", "0,100", "--traces", str(path), "--vocab-size", str(VOCAB), "--dtype", "float32",
                            "--requests", "2", "--max-new-tokens", "20", "--shape", "0.5b")
    assert code == 0
    rows = out["results"]
    assert [(r["context"], r["variant"], r["method"]) for r in rows] == [
        (c, v, m) for c, variants in ((0, ["prompt"]), (100, ["prompt", "documents"])) for v in variants for m in CORE]
    for r in rows:
        assert r["exact"] and r["tokens"] == 2 * 20 and r["requests"] == 2, r
        assert r["ttft_ms"] * r["requests"] + r["tpot_ms"] * (r["tokens"] - r["requests"]) == pytest.approx(r["seconds"] * 1e3)
    assert main(["bench", "--context", "0,-1", "--traces", str(path)]) == 2
    assert "--context takes a comma list" in capsys.readouterr().err


def test_gpu_script_dry_run_runs_every_step_and_writes_its_outputs(tmp_path):
    # benchmarks/gpu.sh as the device runs it, at a toy shape on this machine's CPU.
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = [write_traces(tmp_path, f"{name}.jsonl", requests=3, seed=i) for i, name in enumerate(("a", "b"))]
    out = tmp_path / "out"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(Path.home())}
    done = subprocess.run(["bash", str(root / "benchmarks" / "gpu.sh"), "--dry-run", "--out", str(out), "--traces", *map(str, files),
                           "--vocab-size", str(VOCAB)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    names = ["trace bench, 0.5B shape", "trace bench, 8B shape", "batch bench, 8B shape", "loop overhead", "long context, 0.5B shape"]
    trees = "trees at the device's prices, stories260K"
    stories = (root / "benchmarks" / "carry" / "stories260K").is_dir() or (root.parent / "shared" / "models" / "stories260K").is_dir()
    assert list(results) == ["environment", *names] + [trees] * stories and results["environment"]["dry_run"] is True
    for name in names:
        rows = results[name]["results"]
        assert rows and all(r["exact"] for r in rows), name
    if stories:  # the sixth step, where the trained tiny Llama is at hand
        assert {r["source"] for r in results[trees]["tpot"]} == {"lookup (default drafter)", "blend (default drafter)"}
    methods = {r["method"] for r in results["trace bench, 0.5B shape"]["results"]}
    assert methods == {"greedy", "hf prompt lookup k=10", "hf prompt lookup k=16", "lookahead assistant_model", "lookahead.generate",
                       "lookahead.generate tree", "lookahead.generate lookup alone"}
    assert {r["batch"] for r in results["batch bench, 8B shape"]["results"]} == {1, 2}
    tables = (out / "tables.md").read_text()
    assert all(f"## {name}" in tables for name in names) and tables.count("| exact |") == len(names)


def test_the_caption_counts_the_prompts_read_not_requests_asked(tmp_path, capsys):
    from tests.models import STORIES, stories_model

    stories_model()  # skips where ../shared is absent
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Once upon a time"}\n{"prompt": "Tom had a red ball."}\n')
    assert main(["bench", "--model", str(STORIES), "--prompts", str(prompts), "--max-new-tokens", "8", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "2 request(s) per workload" in out  # --requests defaults to 3; the file holds 2


def test_cold_bench_runs_each_call_in_a_fresh_process(tiny, tmp_path, capsys, monkeypatch):
    from lookahead.bench import cold

    specs = []

    def in_this_process(spec, fresh_kernels):  # the child's work, without a process per call (the tiny shape is patched here)
        specs.append(spec)
        started = time.perf_counter()
        result = cold.child(spec)
        result["process_s"] = result.pop("ended") - started
        return result

    monkeypatch.setattr(cold, "cold_call", in_this_process)
    path = write_traces(tmp_path, requests=1)
    code, out, _ = run_json(capsys, "--cold", "--traces", str(path), "--max-new-tokens", "24", "--dtype", "float32", "--repeats", "2",
                            "--shape", "tiny", "--prompt-tokens", "30")
    assert code == 0
    assert [s["method"] for s in specs] == list(cold.METHODS) * 2  # methods taking turns, each repeat
    assert all(len(s["prompt"]) == 30 for s in specs)
    assert [r["method"] for r in out["results"]] == list(cold.METHODS)
    assert all(r["exact"] and r["seconds"] > 0 and r["vs_greedy_min"] <= r["vs_greedy_max"] for r in out["results"])
    assert all(r["process_s"] >= r["seconds"] and r["process_vs_greedy_min"] <= r["process_vs_greedy_max"] for r in out["results"])
    assert out["results"][0]["vs_greedy"] == out["results"][0]["process_vs_greedy"] == 1.0


def test_a_cold_call_is_a_fresh_python_with_an_empty_home(monkeypatch):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from lookahead.bench import cold

    seen = {}

    def run(argv, *, env, **kwargs):
        seen.update(argv=argv, env=env, home=env["HOME"], empty=not any(Path(env["HOME"]).iterdir()))
        return subprocess.CompletedProcess(argv, 0, stdout='progress\n{"seconds": 1.5}\n', stderr="")

    monkeypatch.setattr(cold.subprocess, "run", run)
    assert cold.cold_call({"method": "greedy", "dtype": "float32"}) == {"seconds": 1.5}  # the child's last line
    assert seen["argv"][:2] == [sys.executable, "-c"] and "child_main" in seen["argv"][2] and seen["empty"]
    assert seen["argv"][2].index("import torch, transformers") < seen["argv"][2].index("lookahead")  # a user's order
    assert not Path(seen["home"]).exists()  # removed after the call
    assert "NUMBA_CACHE_DIR" not in seen["env"] or seen["env"]["NUMBA_CACHE_DIR"] == os.environ.get("NUMBA_CACHE_DIR")
    cold.cold_call({"method": "greedy", "dtype": "float32"}, fresh_kernels=True)
    assert seen["env"]["NUMBA_CACHE_DIR"].startswith(seen["home"])  # kernels compiled afresh
