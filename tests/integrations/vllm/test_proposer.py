"""LookupProposer (lookahead.integrations.vllm.proposer) over a fake runner (tests/fake_runner.py): rows followed to
their requests, drafts counted as vLLM counts them (preemptions, steps run without the proposer, placeholders,
trimmed drafts), the caps, memory, tensor-parallel ranks, vLLM main branch's keyword call, and close().
"""

import importlib
import json

import numpy as np
import pytest

from lookahead.integrations.vllm import PROPOSER, LookupProposer
import lookahead.engine.batch as batch_module
from tests.fake_runner import A, B, C, FakeRunner, fake_config, new_proposer


@pytest.mark.parametrize("identity", ["auto", "content"])
def test_rows_follow_requests_through_finish_reuse_and_condense(identity):
    proposer = new_proposer(row_identity=identity)
    runner = FakeRunner(proposer)
    assert (proposer.runner is runner) == (identity == "auto")
    assert runner.step(proposer, [("a", A, [5]), ("b", B, [20])], [[5], [20]]) == [[6, 7, 8, 5], [21, 22, 23, 20]]
    # "a" finished; "c" takes row 0 while "b" stays in row 1 (two of its four drafted tokens accepted)
    assert runner.step(proposer, [("c", C, [40]), ("b", B, [20, 21, 22, 23])], [[40], [21, 22, 23]]) == [[41, 42, 43, 40], [20, 21, 22, 23]]
    assert (proposer.stats.drafts, proposer.stats.draft_tokens, proposer.stats.accepted_tokens) == (1, 4, 2)
    assert proposer.stats.accepted_per_pos == [1, 1, 0, 0]
    # condensed: "c" finished, "b" moves to row 0
    assert runner.step(proposer, [("b", B, [20, 21, 22, 23, 20])], [[20]]) == [[21, 22, 23, 20]]
    assert proposer.stats.requests == 3 and proposer.stats.finished == 2
    assert proposer.stats.rows_by_content == (0 if identity == "auto" else 5)


@pytest.mark.parametrize("identity", ["auto", "content"])
def test_memory_serves_a_later_request(identity):
    proposer = new_proposer(row_identity=identity)
    runner = FakeRunner(proposer)
    runner.step(proposer, [("a", [9, 10, 11, 12, 13], [14])], [[14]])
    runner.step(proposer, [("b", [30, 31], [32])], [[32]])  # "a" finished: filed into memory
    proposer.flush()  # (filed on the proposer's thread, in time for the next step)
    assert len(proposer.memory) > 0
    # "d" writes what "a" wrote: its own tokens never repeat, memory drafts the rest
    assert runner.step(proposer, [("d", [1, 12], [13])], [[13]]) == [[14]]
    assert runner.step(proposer, [("e", [7, 10, 11], [12])], [[12]]) == [[13, 14]]


def test_memory_off_drafts_only_from_the_request():
    proposer = new_proposer(memory=False)
    runner = FakeRunner(proposer)
    runner.step(proposer, [("a", [9, 10, 11, 12, 13], [14])], [[14]])
    assert proposer.memory is None
    assert runner.step(proposer, [("d", [1, 12], [13])], [[13]]) == [[]]


def learnt(proposer, key) -> tuple[list, list]:
    """What a request's keep rate has counted: kept tokens and failures per anchor length."""
    keep = proposer.batch.slots.keep[proposer.batch.requests[key]]
    return keep[:, 0].tolist(), keep[:, 1].tolist()


def test_draft_dropped_by_preemption_is_not_counted_as_rejected():
    """vLLM drops a preempted request's draft; when it resumes, that draft was never verified."""
    proposer = new_proposer()
    runner = FakeRunner(proposer)
    assert runner.step(proposer, [("a", A, [5]), ("b", B, [20])], [[5], [20]]) == [[6, 7, 8, 5], [21, 22, 23, 20]]
    a = "a"
    keep_before = learnt(proposer, a)
    runner.extra_live = ("a",)  # preempted with its draft pending
    runner.step(proposer, [("b", B, [20, 21])], [[21]])  # b's draft: 0 of 4 accepted
    runner.extra_live = ()
    # a resumes: its recomputed prefill samples one token, its old draft was never scheduled
    runner.step(proposer, [("a", A, [5, 6]), ("b", B, [20, 21, 22])], [[6], [22]])
    assert proposer.stats.discarded_drafts == 1
    assert (proposer.stats.drafts, proposer.stats.draft_tokens) == (runner.drafts_verified, runner.draft_tokens_verified) == (2, 8)
    assert proposer.stats.accepted_tokens == 0
    assert learnt(proposer, a) == keep_before  # nothing learnt from the dropped draft


@pytest.mark.parametrize("identity", ["auto", "content"])
def test_draft_dropped_by_preemption_without_spec_token_ids(identity):
    """Without input_batch.spec_token_ids: a draft counts only if its request ran in the step before."""
    proposer = new_proposer(row_identity=identity)
    runner = FakeRunner(proposer)
    del runner.input_batch.spec_token_ids
    runner.step(proposer, [("a", A, [5]), ("b", B, [20])], [[5], [20]])
    runner.extra_live = ("a",)
    runner.step(proposer, [("b", B, [20, 21, 22])], [[21, 22]])
    runner.extra_live = ()
    runner.step(proposer, [("a", A, [5, 6]), ("b", B, [20, 21, 22, 23])], [[6], [23]])
    assert (proposer.stats.drafts, proposer.stats.draft_tokens, proposer.stats.accepted_tokens) == (2, 8, 1)
    assert proposer.stats.discarded_drafts == (1 if identity == "auto" else 0)  # content: "a" came back as a new request


def test_step_run_without_the_proposer_does_not_verify_its_draft():
    """vLLM skips a custom proposer for the whole batch when a row nears max_model_len, and
    verifies K zero tokens per row instead: our pending draft was not what it verified."""
    proposer = new_proposer()
    runner = FakeRunner(proposer)
    assert runner.step(proposer, [("a", A, [5])], [[5]]) == [[6, 7, 8, 5]]
    a = "a"
    keep_before = learnt(proposer, a)
    # a step without propose wrote 6 and drafted zeros; this step verified them (none kept) and wrote 7
    runner.drafts = {"a": [0, 0, 0, 0]}
    runner.step(proposer, [("a", A, [5, 6, 7])], [[7]])
    # vLLM's metrics count its zeros as a draft: so do we, apart (vllm_drafts), learning nothing
    assert (proposer.stats.drafts, proposer.stats.draft_tokens) == (runner.drafts_verified, runner.draft_tokens_verified) == (1, 4)
    assert (proposer.stats.vllm_drafts, proposer.stats.discarded_drafts, proposer.stats.accepted_tokens) == (1, 1, 0)
    assert learnt(proposer, a) == keep_before


def test_placeholders_padding_a_resumed_request_count_as_vllm_counts_them():
    """A preempted request resumed with its prefix cached has one token left to prefill; vLLM
    pads that step to 1 + K tokens with K placeholder drafts (-1), and its metrics count them
    (seen in the served test's preemptions, 2026-12-01): so do we, learning nothing from them."""
    proposer = new_proposer()
    runner = FakeRunner(proposer)
    runner.step(proposer, [("a", A, [5]), ("b", B, [20])], [[5], [20]])
    a = "a"
    keep_before = learnt(proposer, a)
    runner.extra_live = ("a",)  # preempted with its draft pending
    runner.step(proposer, [("b", B, [20, 21])], [[21]])
    runner.extra_live = ()
    runner.drafts["a"] = [-1] * 4  # resumed: its one-token step padded with placeholders, none kept
    runner.step(proposer, [("a", A, [5, 6]), ("b", B, [20, 21, 22])], [[6], [22]])
    assert (proposer.stats.drafts, proposer.stats.draft_tokens) == (runner.drafts_verified, runner.draft_tokens_verified) == (3, 12)
    assert (proposer.stats.vllm_drafts, proposer.stats.discarded_drafts, proposer.stats.accepted_tokens) == (1, 1, 0)
    assert learnt(proposer, a) == keep_before


def test_draft_cut_to_the_step_budget_counts_the_verified_tokens():
    proposer = new_proposer()
    runner = FakeRunner(proposer)
    runner.step(proposer, [("a", A, [5])], [[5]])
    runner.step(proposer, [("a", A, [5, 6, 7])], [[6, 7]], budget={"a": 2})  # the step verified 2 of 4, kept 1
    assert (proposer.stats.drafts, proposer.stats.draft_tokens, proposer.stats.accepted_tokens) == (1, 2, 1)


def test_preempted_request_keeps_its_drafter():
    proposer = new_proposer()
    runner = FakeRunner(proposer)
    runner.step(proposer, [("a", A, [5]), ("b", B, [20])], [[5], [20]])
    runner.extra_live = ("a",)  # preempted: out of the batch, still in runner.requests
    runner.step(proposer, [("b", B, [20, 21])], [[21]])
    assert "a" in proposer.batch.requests and proposer.stats.finished == 0
    runner.extra_live = ()
    assert runner.step(proposer, [("a", A, [5, 6]), ("b", B, [20, 21, 22])], [[6], [22]]) == [[7, 8, 5, 6], [23, 20, 21, 22]]
    assert proposer.stats.requests == 2


def test_reused_request_id_with_other_tokens_is_a_new_request():
    proposer = new_proposer()
    runner = FakeRunner(proposer)
    runner.step(proposer, [("a", A, [5])], [[5]])
    assert runner.step(proposer, [("a", C, [40])], [[40]]) == [[41, 42, 43, 40]]
    assert proposer.stats.requests == 2 and proposer.stats.finished == 1


def test_rows_without_sampled_tokens_get_no_draft_and_drafts_stop_at_max_model_len():
    proposer = LookupProposer(fake_config(k=4, max_model_len=14, cost_aware=False))
    runner = FakeRunner(proposer)
    # "a" holds 13 tokens: one more fits in max_model_len 14; "b" is a prefill chunk
    assert runner.step(proposer, [("a", A, [5]), ("b", [1, 2, 3], [])], [[5], []]) == [[6], []]
    assert runner.step(proposer, [("a", A, [5, 6]), ("b", [1, 2, 3], [4])], [[6], [4]]) == [[], []]


def test_drafts_never_exceed_num_speculative_tokens():
    proposer = LookupProposer(fake_config(k=2, cost_aware=False, draft_factor=64.0))
    runner = FakeRunner(proposer)
    assert runner.step(proposer, [("a", A, [5, 6, 7])], [[7]]) == [[8, 5]]


def test_drafts_end_at_eos_unless_told_otherwise():
    prompt = [5, 6, 2, 7] * 3  # the model's EOS (2) inside a repeated run
    for stop_at_eos, expected in ((True, [[6]]), (False, [[6, 2, 7, 5]])):
        proposer = new_proposer(stop_at_eos=stop_at_eos)
        assert FakeRunner(proposer).step(proposer, [("a", prompt, [5])], [[5]]) == expected


def test_two_proposers_fed_the_same_steps_draft_alike():
    """With a given cost (tensor parallel ranks: docs/vllm.md), drafts are a function of the steps alone."""
    proposers = [LookupProposer(fake_config(k=4, fixed_cost_tokens=8.0)) for _ in range(2)]
    runners = [FakeRunner(p) for p in proposers]
    rows = [("a", A, [5]), ("b", B, [20]), ("c", [9, 10, 11, 9, 10], [11])]
    sampled = [[5], [20], [11]]
    for _ in range(12):
        outs = [runner.step(p, rows, sampled) for runner, p in zip(runners, proposers)]
        assert outs[0] == outs[1]
        sampled = [(ids[:1] or [seq[-1]]) for ids, (_, _, seq) in zip(outs[0], rows)]  # the first drafted token kept
        rows = [(key, prompt, output + written) for (key, prompt, output), written in zip(rows, sampled)]
    assert {**vars(proposers[0].stats), "propose_s": 0} == {**vars(proposers[1].stats), "propose_s": 0}


def next_token(seq) -> int:
    """A greedy target model over a small vocabulary: the next token is a function of the prefix alone (a period-7
    cycle that every 11th position breaks), so lookup drafts are kept often and rejected sometimes."""
    if len(seq) % 11 == 0:
        return (seq[-1] * 7 + 3) % 50 + 1
    return seq[-7] if len(seq) >= 7 else (seq[-1] % 50) + 1


def tensor_parallel_serve(output_rank: int, step_costs, prompts, num_tokens: int):
    """Serves `prompts` greedily to `num_tokens` output tokens each, as vLLM 0.32 does under tensor parallelism
    (docs/vllm.md, "Tensor and pipeline parallelism"): every rank's runner calls its own proposer over the same rows,
    the scheduler takes the drafts of `output_rank` alone (MultiprocExecutor.take_draft_token_ids), and every rank's
    input_batch.spec_token_ids holds those (SchedulerOutput.scheduled_spec_decode_tokens). A rank's clock advances
    by its own step cost, seconds = F + p * tokens + D * drafted (step_costs[rank] = (F, p, D)): its load rule
    measures what that rank sees. Returns (outputs, each rank's drafts per step, the proposers)."""
    proposers = [LookupProposer(fake_config(k=4, max_model_len=512)) for _ in step_costs]
    runners = [FakeRunner(p) for p in proposers]
    now = [0.0] * len(step_costs)
    for rank, proposer in enumerate(proposers):
        proposer.clock = lambda rank=rank: now[rank]
    outputs = {f"r{i}": [] for i in range(len(prompts))}
    scheduled: dict = {}  # request id -> the output rank's draft, verified at the next step
    drafts_by_rank = [[] for _ in proposers]
    sampled = {key: [] for key in outputs}
    while any(len(out) < num_tokens for out in outputs.values()):
        live = [key for key, out in outputs.items() if len(out) < num_tokens]
        spec = [scheduled.get(key, []) for key in live]
        for key, draft in zip(live, spec):  # the verify step: the greedy target keeps the draft's matching prefix
            seq = prompts[int(key[1:])] + outputs[key]
            written = []
            for token in draft:
                if token != next_token(seq + written):
                    break
                written.append(token)
            written.append(next_token(seq + written))  # and writes its own next token
            outputs[key] += written
            sampled[key] = written
        rows = [(key, prompts[int(key[1:])], outputs[key]) for key in live]
        tokens = len(live) + sum(map(len, spec))
        for rank, (proposer, runner) in enumerate(zip(proposers, runners)):
            fixed, per_token, drafted = step_costs[rank]
            now[rank] += fixed + per_token * tokens + drafted * any(spec)
            runner.requests = {key: None for key in live}
            runner.input_batch.set_rows(rows, spec)  # every rank verifies the scheduled drafts, whoever made them
            out = proposer.propose([sampled[key] for key in live], runner.input_batch.num_tokens_no_spec,
                                   runner.input_batch.token_ids_cpu)
            drafts_by_rank[rank].append(out)
            if rank == output_rank:
                scheduled = dict(zip(live, out))
    return {key: out[:num_tokens] for key, out in outputs.items()}, drafts_by_rank, proposers


def test_tensor_parallel_ranks_timed_apart_draft_apart_yet_write_the_same_output():
    """Two ranks whose measured step costs differ (a fixed-cost-bound step on rank 0, a per-token-bound one with a
    dear drafted step on rank 1) size different drafts for the same rows; whichever rank's drafts the scheduler
    takes, every rank verifies those, and the greedy output is the target's, token for token. Each rank counts the
    drafts the step verified, as vLLM's metrics do; a draft that is not a prefix of its own is vLLM's own there."""
    prompts = [[3, 9, 4, 17, 8, 2, 6] * 3, [12, 5, 30, 7, 1, 44, 21] * 3, [5, 6, 7, 8, 9, 10, 11, 12] * 2]
    costs = [(0.050, 0.0001, 0.0), (0.0001, 0.002, 0.050)]  # (F, p, D) seconds: h = 500 on rank 0, 0.05 on rank 1
    num_tokens = 60
    expected = {}
    for i, prompt in enumerate(prompts):
        seq = list(prompt)
        while len(seq) < len(prompt) + num_tokens:
            seq.append(next_token(seq))
        expected[f"r{i}"] = seq[len(prompt):]
    served = {}
    for output_rank in (0, 1):
        outputs, drafts, proposers = served[output_rank] = tensor_parallel_serve(output_rank, costs, prompts, num_tokens)
        assert outputs == expected
        assert any(a != b for a, b in zip(*drafts)), "the ranks drafted alike: the test shows nothing"
        assert sum(map(len, sum(drafts[output_rank], []))) > 0  # drafts were verified (and kept: fewer steps)
        counted = [(p.stats.drafts, p.stats.draft_tokens, p.stats.accepted_tokens) for p in proposers]
        assert counted[0] == counted[1] and counted[0][0] > 0
        assert proposers[output_rank].stats.vllm_drafts == 0
    # rank 1 sends less of the same chains than rank 0: under rank 0's drafts it had mostly sent none, so they are
    # vLLM's own there; rank 1's drafts are prefixes of rank 0's, which rank 0 counts (and learns from) as its own
    assert served[0][2][1].stats.vllm_drafts > 0 and served[1][2][0].stats.vllm_drafts == 0


def test_close_joins_the_proposers_threads_and_refuses_later_steps(tmp_path, monkeypatch):
    import threading

    monkeypatch.setattr(batch_module, "INDEX_AHEAD", 1)  # index between steps: the thread starts
    proposer = new_proposer(stats_path=str(tmp_path / "stats.json"))
    runner = FakeRunner(proposer)
    runner.step(proposer, [("a", A, [5])], [[5]])
    runner.step(proposer, [("b", B, [20])], [[20]])  # "a" finished: filed into memory on the thread
    threads = [proposer.batch.worker._thread, proposer._stats_file._thread]
    assert all(t in threading.enumerate() for t in threads)
    proposer.close()
    assert not any(t.is_alive() for t in threads)
    assert len(proposer.memory) > 0 and json.loads((tmp_path / "stats.json").read_text())["finished"] == 1
    with pytest.raises(RuntimeError, match="closed"):
        runner.step(proposer, [("b", B, [20, 21])], [[21]])
    with new_proposer() as other:  # a context manager closes it too
        FakeRunner(other).step(other, [("c", C, [40])], [[40]])
    assert other._closed and not other.batch.worker.alive


def test_a_collected_proposer_joins_its_thread(monkeypatch):
    import gc

    monkeypatch.setattr(batch_module, "INDEX_AHEAD", 1)
    proposer = new_proposer()
    runner = FakeRunner(proposer)
    runner.step(proposer, [("a", A, [5])], [[5]])
    runner.step(proposer, [("b", B, [20])], [[20]])  # "a" finished: filed into memory on the thread
    worker = proposer.batch.worker
    assert worker.alive
    del runner
    del proposer
    gc.collect()
    assert not worker.alive


class MainBranchCustomClassProposer:
    """vLLM main branch's vllm/v1/spec_decode/custom_class_proposer.py CustomClassProposer, as it drives a
    user class: built from speculative_config.custom_proposer_backend, load_model passed through, propose
    called by keyword and any error from it re-raised as a RuntimeError."""

    def __init__(self, vllm_config):
        backend = vllm_config.speculative_config.custom_proposer_backend
        module_path, class_name = backend.rsplit(".", 1)
        user_class = getattr(importlib.import_module(module_path), class_name)
        self.user_proposer = user_class(vllm_config)
        self._backend = backend

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        try:
            return self.user_proposer.propose(sampled_token_ids=sampled_token_ids, num_tokens_no_spec=num_tokens_no_spec,
                                              token_ids_cpu=token_ids_cpu, slot_mappings=slot_mappings)
        except Exception as e:
            raise RuntimeError(f"Custom proposer class '{self._backend}' raised an error in propose(): {e}") from e

    def load_model(self, *args, **kwargs):
        if hasattr(self.user_proposer, "load_model"):
            return self.user_proposer.load_model(*args, **kwargs)


def test_main_branch_keyword_call_drafts_as_the_positional_call():
    config = fake_config(cost_aware=False)
    config.speculative_config.custom_proposer_backend = PROPOSER
    wrapper = MainBranchCustomClassProposer(config)
    direct = new_proposer()
    runners = [FakeRunner(wrapper), FakeRunner(direct)]
    assert wrapper.user_proposer.runner is runners[0]  # found through the wrapper
    steps = [([("a", A, [5]), ("b", B, [20])], [[5], [20]]), ([("c", C, [40]), ("b", B, [20, 21, 22, 23])], [[40], [21, 22, 23]]),
             ([("b", B, [20, 21, 22, 23, 20])], [[20]])]
    for rows, sampled in steps:
        assert runners[0].step(wrapper, rows, sampled) == runners[1].step(direct, rows, sampled)
    assert {**vars(wrapper.user_proposer.stats), "propose_s": 0} == {**vars(direct.stats), "propose_s": 0}
    with pytest.raises(RuntimeError, match=r"LookupProposer' raised an error in propose\(\): lookahead: propose got 2 rows"):
        wrapper.propose([[1], [2]], np.array([3], dtype=np.int32), np.zeros((1, 8), dtype=np.int32))
