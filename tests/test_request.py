"""lookahead.request.Request: the per-request bookkeeping every loop and replay share."""

import numpy as np

from lookahead import LookupDrafter, TokenStore
from lookahead.request import Request
from lookahead.sizing.cost import CostCurve, LineCost


def started(tokens, **options) -> Request:
    request = Request(LookupDrafter(memory=False, **options), sized=True)
    request.start(tokens)
    return request


def test_a_step_records_what_was_drafted_and_kept_and_indexes_what_the_model_wrote():
    request = started([1, 2, 3, 4, 1, 2])
    plan = request.plan(8, LineCost(1000.0))
    assert plan.draft.token_ids.tolist()[:2] == [3, 4] and plan.size == len(plan.draft)
    request.verified([3, 4, 7])
    assert (request.stats.drafted_per_step, request.stats.accepted_per_step) == ([len(plan.draft)], [2])
    assert request.drafter.index.tokens.tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 7]
    assert sum(request.keep_rate.kept) == 2 and sum(request.keep_rate.failed) == 1  # two kept, then a failure


def test_sizes_follow_the_keep_rate_and_the_cost():
    request = started([5, 6, 7, 8] * 6, num_draft_tokens=8)
    dear = CostCurve(1 + np.arange(66.0))  # every token costs as much as a step
    assert len(request.plan(8, dear).draft) == 0  # a plain step at a keep chance of 1/2
    request.verified([5])
    for _ in range(6):  # the model keeps every drafted token
        plan = request.plan(8, LineCost(1000.0))
        request.verified(plan.draft.token_ids.tolist() + [int(plan.draft.token_ids[0]) if len(plan.draft) else 5])
    assert request.keep_chance(request.propose(8)) > 0.8


def test_a_discarded_plan_teaches_nothing_and_extend_indexes_without_a_plan():
    request = started([1, 2, 3, 1, 2])
    request.plan(4, LineCost(1000.0))
    before = (list(request.keep_rate.kept), list(request.keep_rate.failed))
    request.discard()
    request.extend([3, 1])  # the server moved the row on without verifying the draft
    assert request.keep_rate.kept == before[0] and request.keep_rate.failed == before[1]
    assert request.last is None and request.drafter.index.tokens.tolist() == [1, 2, 3, 1, 2, 3, 1]


def test_a_trimmed_draft_teaches_only_the_tokens_checked():
    request = started([1, 2, 3, 4, 5, 1, 2])
    plan = request.plan(5, LineCost(1000.0))
    assert plan.draft.token_ids.tolist()[:3] == [3, 4, 5]
    request.verified([3, 4], checked=1)  # the server verified one drafted token, kept it, then wrote 4 of its own
    # 3 counted as verified; 4, unverified, counted as the output shows it (after the fade); 5 still watched
    assert sum(request.keep_rate.kept) == 0.9 * 1 + 1 and sum(request.keep_rate.failed) == 0
    assert request.keep_rate.watched


def test_unsized_requests_verify_whole_drafts():
    request = Request(LookupDrafter(memory=False), sized=False)
    request.start([1, 2, 3, 4, 1, 2])
    assert request.keep_rate is None and request.keep_chance(request.propose(8)) == 1.0
    assert request.plan(8, LineCost(1.0)).draft.token_ids.tolist() == [3, 4, 1, 2]
    tree = request.plan(8, tree=True)
    assert tree.size == 0 and len(tree.chain) == 0 and len(tree.draft) >= 1


def test_finish_files_the_request_into_memory_and_its_stats_stay_readable():
    memory = TokenStore()
    drafter = LookupDrafter(memory=memory, num_draft_tokens=3)
    request = Request(drafter, sized=False)
    request.start([1, 2, 3, 1, 2])
    plan = request.plan(3)
    assert plan.draft.token_ids.tolist()[:1] == [3]
    request.verified([3, 40, 41, 42, 43], accepted=1)  # the model kept 3, then wrote on
    stats = request.stats
    request.finish()
    assert drafter.num_tokens == 0 and request.last is None and memory.num_sequences == 1
    assert request.stats is stats and (stats.steps, stats.drafted, stats.accepted) == (1, len(plan.draft), 1)  # the finished request's
    drafter.finish()  # nothing indexed: nothing filed
    assert memory.num_sequences == 1
    request.start([7, 40, 41])  # a later request drafts from the finished one, with stats of its own
    assert request.propose(3).token_ids.tolist() == [42, 43] and request.stats.steps == 0
