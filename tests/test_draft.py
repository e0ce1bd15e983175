"""DraftStats explain themselves: tokens drafted and kept per source, steps without a draft and why, per token its source."""

import itertools

import numpy as np
import pytest
import torch
import transformers

import lookahead
from lookahead import DraftStats, LookupDrafter
from lookahead.draft import (
    DRAFTED, MODEL, NO_ROOM, NONE_FOUND, NOT_PAID, OUTPUT, PREDICTIONS, PROMPT, RARELY_KEPT, SOURCES, no_draft_reason, no_draft_reasons,
)
from lookahead.request import Request
from lookahead.sizing.cost import LineCost
from tests.models import STORIES, stories_model, tiny_model

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play with her toys. "
         "Once upon a time, there was a little girl named Lily. She")  # the model goes on copying the first sentence


def assert_adds_up(stats: DraftStats) -> None:
    drafted = sum(d for d, _ in stats.by_source.values())
    kept = sum(k for _, k in stats.by_source.values())
    assert (drafted, kept) == (stats.drafted, stats.accepted)
    assert all(k <= d for d, k in stats.by_source.values())
    assert sum(stats.no_draft.values()) == sum(1 for d in stats.drafted_per_step if d == 0)
    assert stats.token_sources.shape == stats.token_steps.shape == stats.token_ids.shape


def test_record_counts_sources_and_reasons_and_prints_them_in_words():
    stats = DraftStats()
    stats.record(3, sources=np.array([PROMPT, PROMPT, OUTPUT], dtype=np.int8))
    stats.record_accepted(2, written=[7, 8, 9], sources=np.array([PROMPT, PROMPT], dtype=np.int8))
    stats.record(0, no_draft=3)  # verifying more did not pay
    stats.record_accepted(0, written=[10])
    stats.record(2)  # a loop that does not say where its drafts came from
    stats.record_accepted(1)
    assert stats.by_source == {"prompt": (2, 2), "output": (1, 0), "other": (2, 1)}
    assert stats.no_draft == {"verifying more did not pay on this hardware": 1}
    assert stats.token_ids.tolist() == [7, 8, 9, 10]
    assert [SOURCES[s] for s in stats.token_sources] == ["prompt", "prompt", "model", "model"]
    assert stats.token_steps.tolist() == [0, 0, 0, 1]
    assert str(stats) == repr(stats) == (
        "6 tokens in 3 forward passes (2.00 per pass); kept 3 of 5 drafted: prompt 2 of 2, output 0 of 1, other 1 of 2; "
        "no draft on 1 step (1 verifying more did not pay on this hardware)"
    )
    assert_adds_up(stats)
    batch = DraftStats(rows=2)
    batch.add(stats)
    batch.add(stats)
    assert batch.token_steps.tolist() == [0, 0, 0, 1, 3, 3, 3, 4] and batch.by_source["prompt"] == (4, 4)
    assert str(batch).startswith("12 tokens in 6 row-steps of 2 rows (2.00 per row-step)")
    assert str(DraftStats()) == "no steps yet"


def test_a_repeated_prompt_gives_prompt_sourced_keeps_and_the_output_its_own():
    request = Request(LookupDrafter(memory=False, predictions=False, num_draft_tokens=4), sized=False)
    request.start([5, 6, 7, 8, 9, 5, 6])
    plan = request.plan(16)
    assert plan.draft.token_ids.tolist() == [7, 8, 9, 5] and set(plan.draft.sources.tolist()) == {PROMPT}
    request.verified([7, 8, 9, 5, 6])  # the model kept the four and wrote 6
    assert request.stats.by_source == {"prompt": (4, 4)}
    assert request.stats.token_sources.tolist() == [PROMPT] * 4 + [MODEL]
    plan = request.plan(16)  # the text repeats: what followed "5 6" last is the output's own
    assert set(plan.draft.sources.tolist()) == {OUTPUT}
    request.verified([1])
    assert request.stats.by_source == {"prompt": (4, 4), "output": (len(plan.draft), 0)}
    assert_adds_up(request.stats)
    request.start([1, 2, 3])
    request.plan(16)  # 3 occurred nowhere before
    request.verified([4])
    assert request.stats.no_draft == {"no continuation found": 1}


def test_a_step_the_sizer_skipped_is_counted_with_its_reason():
    request = Request(LookupDrafter(memory=False, predictions=False), sized=True)
    request.start([5, 6, 7, 8, 5, 6, 7, 8, 5, 6])
    dear = LineCost(0.01)  # every verified token costs as much as a step: no draft pays
    plan = request.plan(16, dear)
    assert len(plan.draft) == 0 and request.keep_chance(plan.chain) >= 0.5
    request.verified([7])
    assert request.stats.no_draft == {"verifying more did not pay on this hardware": 1}
    for _ in range(3):  # each draft's first token rejected, step after step: the keep chance falls
        plan = request.plan(16, LineCost(1000.0))
        assert len(plan.draft)
        request.verified([int(plan.draft.token_ids[0]) + 1])
    plan = request.plan(16, dear)
    assert len(plan.draft) == 0 and len(plan.chain) and request.keep_chance(plan.chain) < 0.5
    request.verified([int(plan.chain.token_ids[0]) + 1])
    assert request.stats.no_draft["drafts were rarely kept"] == 1
    assert_adds_up(request.stats)


def stories_prompt():
    tokenizer = transformers.AutoTokenizer.from_pretrained(STORIES)
    return tokenizer(STORY, return_tensors="pt").input_ids


@pytest.mark.parametrize("loop", ["ours", "assistant_model"])
def test_stats_through_both_loops_add_up_and_a_second_call_copies_from_memory(loop):
    model = stories_model()
    drafter = LookupDrafter(predictions=loop == "ours", cost_aware=False)  # (sized: what pays depends on the machine's load)
    prompt = stories_prompt()

    def call():
        if loop == "ours":
            return lookahead.generate(model, prompt, drafter=drafter, max_new_tokens=48)
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=drafter, max_new_tokens=48)

    first = call()
    stats = drafter.stats
    assert_adds_up(stats)
    assert stats.by_source["prompt"][1] > 0  # the repeated prompt's stretch was copied from it
    written = first[0, prompt.shape[1]:].tolist()
    if loop == "ours":
        assert stats.token_ids.tolist() == written  # every token, with its source and step
        assert (stats.token_sources == MODEL).sum() == stats.steps
    else:  # the last step's block never reaches the drafter
        assert stats.token_ids.tolist() == written[: len(stats.token_ids)]
    second = call()
    assert torch.equal(first, second)
    assert_adds_up(drafter.stats)
    assert drafter.stats.by_source["memory"][1] > 0  # the first call's output, filed into memory, copied back


def test_a_batch_counts_every_row_step():
    model = tiny_model("llama")
    drafter = LookupDrafter(cost_aware=False)
    input_ids = torch.tensor([[0, 5, 6, 7, 5, 6], [9, 8, 9, 8, 9, 8]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    out = lookahead.generate(model, input_ids, attention_mask=mask, drafter=drafter, max_new_tokens=12)
    stats = drafter.stats
    assert stats.rows == 2 and stats.tokens == 24 and "row-steps of 2 rows" in str(stats)
    assert_adds_up(stats)
    assert stats.token_ids.tolist() == out[0, 6:].tolist() + out[1, 6:].tolist()  # row after row
    assert set(np.unique(stats.token_sources).tolist()) <= {MODEL, PROMPT, OUTPUT, PREDICTIONS}


def test_no_draft_reasons_are_no_draft_reason_over_rows():
    drafted, found, room, chances = (np.array(v) for v in zip(*itertools.product([0, 3], [0, 5], [0, 7], [0.2, 0.5, 0.9])))
    expected = [DRAFTED if d else no_draft_reason(f, r, lambda c=c: c) for d, f, r, c in zip(drafted, found, room, chances)]
    got = no_draft_reasons(drafted, found, room, chances)
    assert got.dtype == np.uint8 and got.tolist() == expected
    assert set(expected) == {DRAFTED, NONE_FOUND, NO_ROOM, RARELY_KEPT, NOT_PAID}
