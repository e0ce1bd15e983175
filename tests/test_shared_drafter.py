"""One drafter used by two threads at once: the second request is refused with DrafterInUseError, never garbled."""

import sys
import threading

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

import lookahead
from lookahead import DrafterInUseError, LookupDrafter
from tests.models import tiny_model
from tests.threads import run_in_threads, start_threads

LONG = [5, 6, 7, 8, 9, 10, 11, 12] * 6  # 48 tokens: repeats, so drafts are long and accepted
SHORT = [20, 21, 22, 20, 21]


class Pause(LogitsProcessor):
    """Holds the generating thread at its `at`-th call until `release` is set."""

    def __init__(self, at: int):
        self.at, self.calls = at, 0
        self.reached, self.release = threading.Event(), threading.Event()

    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls == self.at:
            self.reached.set()
            assert self.release.wait(timeout=120)
        return scores


def generate(loop: str, model, prompt, drafter, **options):
    options = dict(max_new_tokens=12, do_sample=False) | options
    if loop == "transformers":
        return model.generate(torch.tensor([prompt]), assistant_model=drafter, **options)
    return lookahead.generate(model, torch.tensor([prompt]), drafter=drafter, **options)


def plain(model, prompt, **options):
    return model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, **options).tolist()


def test_a_second_request_while_our_engine_runs_is_refused():
    # A regression: the second request reset the drafter under the first one's loop.
    model = tiny_model("llama")
    drafter = LookupDrafter(cost_aware=False)
    pause = Pause(at=3)  # inside the first call's loop, which holds the drafter for the whole call
    results = {}
    errors, join = start_threads(lambda: results.setdefault("first", generate(
        "engine", model, LONG, drafter, logits_processor=LogitsProcessorList([pause]))))
    assert pause.reached.wait(timeout=120)
    try:
        with pytest.raises(DrafterInUseError, match="one drafter per thread.*TokenStore"):
            generate("engine", model, SHORT, drafter)
        with pytest.raises(DrafterInUseError):
            generate("transformers", model, SHORT, drafter)
        with pytest.raises(DrafterInUseError):
            drafter.reset(SHORT)
    finally:
        pause.release.set()
        join()
    assert not errors
    assert results["first"].tolist() == plain(model, LONG)
    assert generate("engine", model, SHORT, drafter).tolist() == plain(model, SHORT)  # free again


def test_a_request_whose_drafter_was_taken_between_its_steps_is_refused():
    # Through transformers' loop the drafter is held one step at a time; another thread's
    # request may start between two steps: the first request must then fail clearly (it
    # raised IndexError inside the adapter, or drafted from the other request's tokens).
    model = tiny_model("llama")
    drafter = LookupDrafter(cost_aware=False)
    pause = Pause(at=3)  # in transformers' verification of the first call, between drafter steps
    results = {}
    errors, join = start_threads(lambda: results.setdefault("first", generate(
        "transformers", model, LONG, drafter, logits_processor=LogitsProcessorList([pause]))))
    assert pause.reached.wait(timeout=120)
    second = generate("transformers", model, SHORT, drafter)  # takes the drafter over
    pause.release.set()
    join()
    assert second.tolist() == plain(model, SHORT)
    assert len(errors) == 1 and isinstance(errors[0], DrafterInUseError), errors
    assert "first" not in results


def test_direct_calls_from_another_thread_are_refused():
    drafter = LookupDrafter()
    drafter.reset([1, 2, 3, 1, 2])
    outcomes = []

    def other():
        for call in (lambda: drafter.extend([3]), drafter.propose, drafter.propose_tree):
            with pytest.raises(DrafterInUseError, match="another thread"):
                call()
        outcomes.append("refused")

    run_in_threads(other)
    assert outcomes == ["refused"]
    assert drafter.propose().token_ids.tolist() == [3, 1, 2]  # the owner goes on
    run_in_threads(lambda: drafter.reset([4, 5]))  # a new request may start in any thread
    with pytest.raises(DrafterInUseError):
        drafter.propose()


def test_finish_while_another_thread_holds_the_drafter_is_refused():
    drafter = LookupDrafter()
    drafter.reset([1, 2, 3, 1, 2])
    with drafter._exclusive():  # a loop's step in this thread
        with pytest.raises(DrafterInUseError):
            run_in_threads(drafter.finish)
    assert drafter.num_tokens == 5  # nothing was filed or dropped
    run_in_threads(drafter.finish)  # between steps a request may be ended from any thread
    with pytest.raises(DrafterInUseError):  # and the thread that drove it is told, not left drafting from nothing
        drafter.propose()


@pytest.mark.parametrize("loops", [("transformers", "transformers"), ("engine", "engine"), ("transformers", "engine")])
def test_two_threads_on_one_drafter_get_exact_output_or_the_clear_error(loops):
    model = tiny_model("llama")
    drafter = LookupDrafter(cost_aware=False)
    prompts = [LONG, SHORT + LONG[:20], LONG[8:] + SHORT]
    expected = {tuple(p): plain(model, p) for p in prompts}
    outcomes = {"exact": 0, "refused": 0}

    def worker(loop, offset):
        for i in range(12):
            prompt = prompts[(i + offset) % len(prompts)]
            try:
                got = generate(loop, model, prompt, drafter)
            except DrafterInUseError:
                outcomes["refused"] += 1
                continue
            assert got.tolist() == expected[tuple(prompt)]
            outcomes["exact"] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads interleave often
    try:
        run_in_threads(lambda: worker(loops[0], 0), lambda: worker(loops[1], 1))
    finally:
        sys.setswitchinterval(interval)
    assert outcomes["exact"] + outcomes["refused"] == 24 and outcomes["exact"] >= 1


def test_a_batch_holds_the_drafter_for_the_whole_call():
    # A batch's rows draft with siblings of the drafter; the drafter itself is held as for one row.
    model = tiny_model("llama")
    drafter = LookupDrafter(cost_aware=False)
    pause = Pause(at=3)
    ids = torch.tensor([[0, 0] + SHORT[:3], SHORT])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1] * 5])
    results = {}
    errors, join = start_threads(lambda: results.setdefault("batch", lookahead.generate(
        model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=12, do_sample=False,
        logits_processor=LogitsProcessorList([pause]))))
    assert pause.reached.wait(timeout=120)
    try:
        with pytest.raises(DrafterInUseError):
            generate("engine", model, SHORT, drafter)
    finally:
        pause.release.set()
        join()
    assert not errors
    assert results["batch"].tolist() == model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False).tolist()
