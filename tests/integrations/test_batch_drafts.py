"""BatchDrafts: a chain batch of lookahead.generate drafts every row through one engine call a step."""

import pytest

import lookahead
from lookahead import LookupDrafter
from lookahead.draft import MEMORY, OTHER, PROMPT, SOURCES, DraftStats
from lookahead.engine import kernels
from lookahead.engine.groups import ROWS_SLOT
from lookahead.integrations import batch_drafts
from lookahead.request import on_path
from tests.integrations.test_generate_batch import left_padded, story_batch
from tests.models import stories_model


def test_every_step_drafts_all_rows_in_one_engine_call(monkeypatch):
    model = stories_model()
    ids, mask = story_batch(model)
    calls, forwards = [], []
    advance = kernels.advance
    monkeypatch.setattr(kernels, "advance", lambda rows, *args: calls.append(rows[ROWS_SLOT].shape[0]) or advance(rows, *args))
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: forwards.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    try:
        got = lookahead.generate(model, ids, attention_mask=mask, drafter=LookupDrafter(cost_aware=False), tree=False,
                                 max_new_tokens=40, do_sample=False)
    finally:
        hook.remove()
    assert got.tolist() == model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False).tolist()
    assert calls == forwards  # one advance a step, over the rows that step's block held
    assert calls[0] == 4 and min(calls) < 4  # rows ended apart and left


def test_stats_count_each_rows_steps_and_where_its_kept_tokens_came_from():
    model = stories_model()
    ids, mask = story_batch(model)
    drafter = LookupDrafter(cost_aware=False)
    out = lookahead.generate(model, ids, attention_mask=mask, drafter=drafter, tree=False, max_new_tokens=30, do_sample=False)
    stats = drafter.stats
    assert stats.rows == 4 and stats.tokens == 4 * 30 and stats.accepted > 0
    assert stats.token_ids.tolist() == [t for row in out[:, ids.shape[1] :].tolist() for t in row]  # row after row
    by_source = stats.by_source
    assert by_source[SOURCES[PROMPT]][1] > 0 and SOURCES[OTHER] not in by_source  # the stories copy their prompts
    # a second batch of the same prompts copies the first's outputs from memory
    again = LookupDrafter(memory=drafter.memory, cost_aware=False)
    lookahead.generate(model, ids, attention_mask=mask, drafter=again, tree=False, max_new_tokens=30, do_sample=False)
    assert again.stats.by_source[SOURCES[MEMORY]][1] > 0


def test_a_row_without_room_drafts_nothing_and_says_so():
    model = stories_model()
    ids, mask = left_padded([[1, 5, 6, 7, 5, 6, 7, 5, 6], [1, 8, 9, 8, 9, 8]])
    drafter = LookupDrafter(cost_aware=False)
    lookahead.generate(model, ids, attention_mask=mask, drafter=drafter, tree=False, max_new_tokens=1, do_sample=False)
    assert drafter.stats.steps == 2 and drafter.stats.no_draft == {"no room left before max_new_tokens": 2}


def test_the_rows_keep_chances_are_the_slots(monkeypatch):
    # the sizer reads each row's keep chance at its chain's anchor, as Request.keep_chance reads one row's
    seen = []
    original = batch_drafts.static_batch_draft_sizes
    monkeypatch.setattr(batch_drafts, "static_batch_draft_sizes",
                        lambda chances, *args, cost: seen.append(chances.copy()) or original(chances, *args, cost=cost))
    model = stories_model()
    ids, mask = story_batch(model)
    lookahead.generate(model, ids, attention_mask=mask, drafter=LookupDrafter(), tree=False, max_new_tokens=40, do_sample=False)
    assert seen and all(((0 < c) & (c < 1)).all() for c in seen)
    assert any((c != 0.5).any() for c in seen)  # learnt from the steps, not the prior alone


def test_a_row_that_ends_is_in_memory_for_the_rows_going_on(monkeypatch):
    model = stories_model()
    ids, mask = story_batch(model)
    drafter = LookupDrafter(cost_aware=False)
    steps, filed_at = [], []
    advance = kernels.advance
    monkeypatch.setattr(kernels, "advance", lambda *args: steps.append(1) or advance(*args))
    add = drafter.memory.add
    monkeypatch.setattr(drafter.memory, "add", lambda tokens: filed_at.append(len(steps)) or add(tokens))
    lookahead.generate(model, ids, attention_mask=mask, drafter=drafter, tree=False, max_new_tokens=40, do_sample=False)
    assert len(filed_at) == 4 and filed_at[0] < len(steps)  # the first row to end was filed while others still drafted


@pytest.mark.parametrize("tree", [False, True])
def test_the_calls_stats_are_each_rows_steps_as_draft_stats_records_them(monkeypatch, tree):
    # The stats are logged per step over the rows and assembled once (call_stats); here each row's DraftStats is
    # also recorded step by step (record, then record_accepted with what it wrote), as a one-row request records its
    # own: the two agree on every step, source and written token, rows ending on EOS inside a kept block included.
    model = stories_model()
    ids, mask = story_batch(model)
    rows: dict[int, DraftStats] = {}
    plan, verified = batch_drafts.BatchDrafts.plan, batch_drafts.BatchDrafts.verified

    def recorded_plan(self, rooms, *args, **kwargs):
        drafts = plan(self, rooms, *args, **kwargs)
        reasons = self._log[-1][2]
        for i, (row, draft) in enumerate(zip(self.rows, drafts)):
            rows.setdefault(row, DraftStats()).record(len(draft), sources=draft.source_codes(), no_draft=int(reasons[i]))
        return drafts

    def recorded_verified(self, i, written, kept):
        draft = self._drafts[i]
        sources = draft.source_codes()[:kept] if draft.is_chain or not kept else draft.source_codes()[on_path(draft, written[:kept])]
        rows[self.rows[i]].record_accepted(kept, written=written, sources=sources)
        verified(self, i, written, kept)

    monkeypatch.setattr(batch_drafts.BatchDrafts, "plan", recorded_plan)
    monkeypatch.setattr(batch_drafts.BatchDrafts, "verified", recorded_verified)
    drafter = LookupDrafter(cost_aware=False)
    eos = int(ids[0, -3])  # a prompt token: copied drafts hold it, and rows end on it inside kept blocks
    lookahead.generate(model, ids, attention_mask=mask, drafter=drafter, tree=tree, max_new_tokens=40, do_sample=False,
                       eos_token_id=eos, pad_token_id=0)
    expected = DraftStats(rows=len(rows))
    for row in sorted(rows):
        expected.add(rows[row])
    stats = drafter.stats
    assert stats.steps < 4 * 40 and stats.accepted > 0  # rows ended early, drafts were kept
    for field in ("drafted_per_step", "accepted_per_step", "no_draft_per_step", "source_codes", "written", "rows"):
        assert getattr(stats, field) == getattr(expected, field), field
