"""`lookahead replay` over traces carrying the model's top-k (`topk_token_ids`), and `lookahead bench --write-trace`."""

import functools
import json

import pytest

from lookahead.bench.cli import main
from lookahead.bench.replay import drafter_for, load_trace, replay_lookahead
from tests.models import STORIES

# The sequence 1 7 | 2 9 7 2 4 (prompt | output); row i of the top-k: the next token first, then 8.
SEQUENCE = [1, 7, 2, 9, 7, 2, 4]
HAND = {"prompt_token_ids": SEQUENCE[:2], "generated_token_ids": SEQUENCE[2:],
        "topk_token_ids": [[t, 8] for t in SEQUENCE[1:]] + [[0, 8]]}


def write_trace(tmp_path, rows, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.mark.parametrize(
    "topk, message",
    [
        ([[7, 8]] * 6, "t.jsonl:1: 'topk_token_ids' must hold one row per prompt and output token (7), got 6 rows"),
        ({"0": [7]}, "t.jsonl:1: 'topk_token_ids' must hold one row per prompt and output token (7), got dict"),
        ([[7, 8]] * 6 + [[7]], "t.jsonl:1: 'topk_token_ids'[6] must be a list of k integer token ids (k >= 1, as many in every row; row 0 has 2)"),
        ([[]] * 7, "t.jsonl:1: 'topk_token_ids'[0] must be a list of k integer token ids"),
        ([[7, 8]] * 3 + [7] + [[7, 8]] * 3, "t.jsonl:1: 'topk_token_ids'[3] must be a list of k integer token ids"),
        ([[7, 8.0]] * 7, "t.jsonl:1: 'topk_token_ids'[0] must be a list of k integer token ids"),
        ([[7, True]] * 7, "t.jsonl:1: 'topk_token_ids'[0] must be a list of k integer token ids"),
        ([[7, 8]] * 2 + [[7, -1]] + [[7, 8]] * 4, "t.jsonl:1: 'topk_token_ids'[2] holds token id -1, outside"),
        ([[7, 8]] * 6 + [[7, 2**64]], "t.jsonl:1: 'topk_token_ids'[6] holds token id 18446744073709551616, outside"),
        ([[7, 8]] * 5 + [[3, 3]] + [[7, 8]], "t.jsonl:1: 'topk_token_ids'[5] names an id twice: [3, 3]"),
    ],
)
def test_malformed_topk_is_refused_naming_file_and_line(tmp_path, capsys, topk, message):
    path = write_trace(tmp_path, [dict(HAND, topk_token_ids=topk)])
    assert main(["replay", str(path)]) == 2
    assert message in capsys.readouterr().err
    path = write_trace(tmp_path, [HAND, dict(HAND, topk_token_ids=topk)])  # the second line
    assert main(["replay", str(path)]) == 2
    assert message.replace("t.jsonl:1:", "t.jsonl:2:") in capsys.readouterr().err


def test_the_table_drafts_what_lookup_cannot(tmp_path):
    (request,) = load_trace(write_trace(tmp_path, [HAND]))
    assert request.topk.tolist() == HAND["topk_token_ids"] and request.topk.dtype.name == "int64"
    # min_ngram=2: lookup needs two tokens matched, and no 2-gram repeats before the last step.
    counts = {source: replay_lookahead([request], drafter_for(source, min_ngram=2), tree=True) for source in ("lookup", "table", "blend")}
    # lookup: 5 steps of the model's own token; the last ([7, 2] seen before) has no room left.
    assert (counts["lookup"]["steps"], counts["lookup"]["tokens"], counts["lookup"]["accepted"]) == (5, 5, 0)
    # The table: step 1 writes 2 and records row 7 = [2, 8] (the prompt's last token, the block's entry); steps 2, 3
    # write 9 and 7 (rows 2 and 9 unknown before); step 4 drafts 7's row, {2, 8} (room for one token), keeps 2, writes 4.
    for source in ("table", "blend"):
        assert (counts[source]["steps"], counts[source]["tokens"], counts[source]["accepted"], counts[source]["drafted"]) == (4, 5, 1, 2)
    # A plain chain takes none of the table's paths (drafter.PREDICTION_CHAIN_NODES): the blend's chains are lookup's.
    assert replay_lookahead([request], drafter_for("blend", min_ngram=2))["steps"] == 5


def test_replay_cli_sources_fresh_and_kept(tmp_path, capsys):
    path = write_trace(tmp_path, [HAND, HAND])

    def replay(*flags):
        assert main(["replay", str(path), "--json", "--min-ngram", "2", "--tree", *flags]) == 0
        return json.loads(capsys.readouterr().out)["results"][0]

    fresh = {source: replay("--source", source, "--fresh") for source in ("lookup", "table", "blend")}
    assert [fresh[s]["steps"] for s in ("lookup", "table", "blend")] == [10, 8, 8]  # each request as alone
    assert fresh["blend"]["drafter"].endswith("fresh blend tree<=64")
    kept = replay()  # one drafter: the second request drafts from the first's memory and table
    assert kept["drafter"].endswith(" blend tree<=64") and kept["steps"] < 8
    plain = write_trace(tmp_path, [{k: HAND[k] for k in ("prompt_token_ids", "generated_token_ids")}], name="plain.jsonl")
    assert main(["replay", str(plain), "--source", "table"]) == 2
    assert "carries none (topk_token_ids)" in capsys.readouterr().err
    assert main(["replay", str(path), "--drafter", "hf", "--fresh"]) == 2
    assert "options of --drafter lookahead" in capsys.readouterr().err


def test_write_trace_needs_a_model_and_one_mode(tmp_path, capsys):
    out = str(tmp_path / "out.jsonl")
    assert main(["bench", "--write-trace", out]) == 2
    assert "--write-trace runs a real model: give --model" in capsys.readouterr().err
    assert main(["bench", "--write-trace", out, "--blend", "--model", "m"]) == 2
    assert "--blend and --write-trace: one bench mode at a time" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def stories_trace(tmp_path, capsys, requests: int, max_new_tokens: int):
    if not STORIES.is_dir():
        pytest.skip(f"{STORIES} is absent (../shared is not laid out beside the project)")
    path = tmp_path / "stories.jsonl"
    assert main(["bench", "--write-trace", str(path), "--model", str(STORIES), "--requests", str(requests),
                 "--max-new-tokens", str(max_new_tokens), "--json"]) == 0
    return path, json.loads(capsys.readouterr().out)


def test_write_trace_top1_is_the_greedy_token(tmp_path, capsys):
    path, report = stories_trace(tmp_path, capsys, requests=2, max_new_tokens=24)
    requests = load_trace(path)
    assert len(requests) == 2 and report["requests"] == 2 and report["top1_disagreements"] == 0
    for request in requests:
        prompt_len, output = request.prompt.shape[0], request.output.tolist()
        assert len(output) == 24 and request.topk.shape == (prompt_len + 24, 8)
        assert request.topk[prompt_len - 1 : -1, 0].tolist() == output  # the forward's top-1 after each token is what greedy wrote


def test_replay_equals_generate_learning_from_the_kept_path(tmp_path, capsys):
    # What a trace knows: with the rejected nodes' predictions off, our loop's steps are replay's, step for step. Cases
    # exact by construction: a tree replay drafts a tree at a request's first step too, where generate's prefill
    # verifies a chain; so trees from the table alone with a fresh drafter (nothing to draft at the first step either way).
    import torch
    import transformers

    import lookahead

    path, _ = stories_trace(tmp_path, capsys, requests=3, max_new_tokens=40)
    requests = load_trace(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(STORIES).eval()
    for source, tree, kept in [("lookup", False, True), ("lookup", False, False), ("table", True, False)]:
        drafter, steps = drafter_for(source, cost_aware=False), 0
        for request in requests:
            drafter = drafter if kept else drafter_for(source, cost_aware=False)
            out = lookahead.generate(model, torch.tensor([request.prompt.tolist()]), drafter=drafter, tree=tree, max_new_tokens=40,
                                     do_sample=False, record_rejected=False)
            assert out[0, request.prompt.shape[0] :].tolist() == request.output.tolist()
            steps += drafter.stats.steps
        replayed = replay_lookahead(requests, drafter_for(source) if kept else functools.partial(drafter_for, source), tree=tree)
        assert replayed["steps"] == steps, (source, tree, kept)
    assert replayed["steps"] < 3 * 40  # the table drafted, and some of it was kept
