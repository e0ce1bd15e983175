"""Which request a row holds (lookahead.integrations.vllm.rows): the runner found up load_model's stack, through a
wrapper and within bounds; without it (or its request ids) rows matched by content, and vLLM's log told once.
"""

import logging
import sys

import pytest

from lookahead.integrations.vllm import LOGGER, find_runner
from tests.fake_runner import A, B, FakeBatch, FakeRunner, new_proposer


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
