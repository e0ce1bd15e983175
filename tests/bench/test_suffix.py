"""`lookahead replay --drafter suffix`: vLLM's SuffixDecoding (arctic-inference) replayed as vLLM 0.32 calls it.

arctic-inference is not in the main suite's environment: these tests skip there, and run in .ci/vllm's venv,
which installs it (the one that checks the error without it runs everywhere)."""

import importlib.util
import json
import random
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from lookahead.bench.cli import main
from lookahead.bench.replay import load_trace
from lookahead.bench.suffix import INSTALL, MAX_CACHED_REQUESTS, MAX_SPEC_FACTOR, MAX_TREE_DEPTH, MIN_TOKEN_PROB

needs_arctic = pytest.mark.skipif(importlib.util.find_spec("arctic_inference") is None,
                                  reason=f"arctic-inference (vLLM's suffix) is not installed here: {INSTALL} (.ci/vllm installs it)")

# a prompt, then an output that runs through it again
REPEATING = {"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "generated_token_ids": [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]}
OTHER = {"prompt_token_ids": [20, 21, 22], "generated_token_ids": [9, 1, 2, 3, 4, 5, 30]}  # its output repeats REPEATING's


def write_trace(tmp_path, rows, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def replay_json(path, *flags, capsys):
    assert main(["replay", str(path), "--drafter", "suffix", "--json", *flags]) == 0
    [row] = json.loads(capsys.readouterr().out)["results"]
    return row


def accepted(tmp_path, rows, *flags, capsys):
    return replay_json(write_trace(tmp_path, rows, name="accepted.jsonl"), *flags, capsys=capsys)["accepted"]


@needs_arctic
def test_suffix_replay_counts_equal_a_hand_simulation(tmp_path, capsys):
    row = replay_json(write_trace(tmp_path, [REPEATING]), capsys=capsys)
    # the prompt's tree and the response so far, matched on the last 24 tokens, drafting at most 1.0 x the match:
    # [8] and [9] have no earlier occurrence: no draft, the model writes 9, then 1.
    # [1] matched (the prompt's start): draft [2], kept, + 3.
    # [1, 2, 3] matched: draft [4, 5, 6], kept, + 7.
    # [1 .. 7] matched: draft [8, 9, 1, 2, 3, 4, 5] (8 then the response), cut to the 3 tokens before the end, kept, + 2.
    assert row["drafter"] == f"vllm suffix k={MAX_TREE_DEPTH} depth={MAX_TREE_DEPTH} factor=1"
    assert (row["steps"], row["tokens"], row["drafted"], row["accepted"]) == (5, 12, 7, 7), row


@needs_arctic
def test_suffix_replay_writes_every_token_and_drafts_from_earlier_responses(tmp_path, capsys):
    path = write_trace(tmp_path, [REPEATING, OTHER, REPEATING])
    row = replay_json(path, capsys=capsys)
    assert row["tokens"] == sum(len(r.output) for r in load_trace(path))
    assert row["tau"] == pytest.approx(row["tokens"] / row["steps"], abs=1e-4) and row["tau"] > 1.0
    assert 0 < row["accepted"] <= row["drafted"]
    # OTHER's prompt holds none of its output: it keeps more after REPEATING, from the global tree of earlier responses
    first, other = accepted(tmp_path, [REPEATING], capsys=capsys), accepted(tmp_path, [OTHER], capsys=capsys)
    assert accepted(tmp_path, [REPEATING, OTHER], capsys=capsys) - first > other
    # --no-memory: no global tree (max_cached_requests=0), so each request drafts as if it came first
    forgetting = replay_json(path, "--no-memory", capsys=capsys)
    assert forgetting["drafter"].endswith(" no-memory")
    assert forgetting["accepted"] == 2 * first + other < row["accepted"]


@needs_arctic
def test_suffix_replay_takes_the_draft_length(tmp_path, capsys):
    path = write_trace(tmp_path, [dict(REPEATING, generated_token_ids=REPEATING["generated_token_ids"] * 3)])
    long_, short = replay_json(path, capsys=capsys), replay_json(path, "--num-draft-tokens", "2", capsys=capsys)
    assert short["drafter"].startswith("vllm suffix k=2 ")
    assert short["drafted"] <= 2 * short["steps"]
    assert short["tau"] <= 3.0 < long_["tau"]


def test_suffix_replay_without_arctic_inference_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "arctic_inference", None)  # import fails, as where it is not installed
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)
    assert main(["replay", str(write_trace(tmp_path, [REPEATING])), "--drafter", "suffix"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith("lookahead replay: error: ") and INSTALL in line


def test_suffix_replay_refuses_our_drafters_options(tmp_path, capsys):
    assert main(["replay", str(write_trace(tmp_path, [REPEATING])), "--drafter", "suffix", "--tree", "--min-ngram", "2"]) == 2
    assert "--tree, --min-ngram: not options of --drafter suffix" in capsys.readouterr().err


@needs_arctic
def test_vllm_suffix_drafts_equal_vllms_own_proposer():
    """VllmSuffix against vllm/v1/spec_decode/suffix_decoding.py's SuffixDecodingProposer on the same engine steps:
    two rows, requests replaced as they finish, each step writing 1 to 3 tokens; vLLM's config defaults are ours."""
    pytest.importorskip("vllm", reason="vLLM is not installed here (.ci/vllm runs this)")
    import dataclasses

    from vllm.config import SpeculativeConfig
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    from lookahead.bench.suffix import VllmSuffix

    defaults = {f.name: f.default for f in dataclasses.fields(SpeculativeConfig) if f.name.startswith("suffix_decoding_")}
    assert defaults == dict(suffix_decoding_max_tree_depth=MAX_TREE_DEPTH, suffix_decoding_max_cached_requests=MAX_CACHED_REQUESTS,
                            suffix_decoding_max_spec_factor=MAX_SPEC_FACTOR, suffix_decoding_min_token_prob=MIN_TOKEN_PROB)
    k, max_model_len = 6, 512
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k, **defaults),
                             model_config=SimpleNamespace(max_model_len=max_model_len))
    theirs, ours = SuffixDecodingProposer(config), VllmSuffix(num_speculative_tokens=k)
    rng = random.Random(0)
    phrases = [[rng.randrange(50) for _ in range(rng.randrange(3, 9))] for _ in range(6)]
    requests = [(sum((rng.choice(phrases) for _ in range(4)), []), sum((rng.choice(phrases) for _ in range(8)), []))
                for _ in range(7)]  # (prompt, output): phrases repeated within and across requests
    batch = SimpleNamespace(token_ids_cpu=np.zeros((2, max_model_len), np.int32), num_tokens_no_spec=np.zeros(2, np.int32),
                            num_prompt_tokens=np.zeros(2, np.int32), req_ids=[None, None], req_id_to_index={})
    written, waiting, compared = [0, 0], list(enumerate(requests)), 0
    while True:
        sampled = [[], []]
        for row in range(2):
            req_id = batch.req_ids[row]
            output = requests[req_id][1] if req_id is not None else []
            if req_id is None or written[row] == len(output):  # finished (or empty): the next request takes the row
                if req_id is not None:
                    del batch.req_id_to_index[req_id]
                    batch.req_ids[row] = None
                if not waiting:
                    continue
                req_id, (prompt, output) = waiting.pop(0)
                batch.req_ids[row], batch.req_id_to_index[req_id] = req_id, row
                batch.token_ids_cpu[row, : len(prompt)] = prompt
                batch.num_prompt_tokens[row] = batch.num_tokens_no_spec[row] = len(prompt)
                written[row] = 0
            # the prefill's one token, or a step's kept draft and the token after it
            new = output[written[row] : written[row] + (rng.randrange(1, 4) if written[row] else 1)]
            n = int(batch.num_tokens_no_spec[row])
            batch.token_ids_cpu[row, n : n + len(new)] = new
            batch.num_tokens_no_spec[row] = n + len(new)
            written[row] += len(new)
            sampled[row] = new
        rows = [row for row in range(2) if batch.req_ids[row] is not None]
        if not rows:
            break
        view = SimpleNamespace(**{**vars(batch), "req_ids": [batch.req_ids[r] for r in rows]})
        view.token_ids_cpu, view.num_tokens_no_spec, view.num_prompt_tokens = (
            batch.token_ids_cpu[rows], batch.num_tokens_no_spec[rows], batch.num_prompt_tokens[rows])
        view.req_id_to_index = {req_id: i for i, req_id in enumerate(view.req_ids)}
        expected = theirs.propose(k, view, [sampled[r] for r in rows])
        got = [ours.propose(batch.req_ids[r], batch.token_ids_cpu[r, : batch.num_prompt_tokens[r]], sampled[r],
                            batch.token_ids_cpu[r, : batch.num_tokens_no_spec[r]]).tolist() for r in rows]
        ours.stop_absent(view.req_ids)
        assert got == expected
        compared += sum(map(bool, got))
    assert compared > 20  # the steps drafted: the comparison compared drafts
