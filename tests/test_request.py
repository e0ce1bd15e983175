"""lookahead.request.Request: the per-request bookkeeping every loop and replay share."""

import random

import numpy as np
import pytest

from lookahead import LookupDrafter, TokenStore
from lookahead.engine import kernels
from lookahead.draft import Draft
from lookahead.predictions import TREE_BANDS, TreeChances
from lookahead.request import Request, on_path
from lookahead.sizing.cost import CostCurve, LineCost
from tests.reference import KeepRate, told_reference


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
    assert request.slots.keep[0].sum(axis=0).tolist() == [2, 1]  # two kept, then a failure


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
    before = request.slots.keep.copy()
    request.discard()
    request.extend([3, 1])  # the server moved the row on without verifying the draft
    assert (request.slots.keep == before).all()
    assert request.last is None and request.drafter.index.tokens.tolist() == [1, 2, 3, 1, 2, 3, 1]


def test_a_trimmed_draft_teaches_only_the_tokens_checked():
    request = started([1, 2, 3, 4, 5, 1, 2])
    plan = request.plan(5, LineCost(1000.0))
    assert plan.draft.token_ids.tolist()[:3] == [3, 4, 5]
    request.verified([3, 4], checked=1)  # the server verified one drafted token, kept it, then wrote 4 of its own
    # 3 counted as verified; 4, unverified, counted as the output shows it (after the fade); 5 still watched
    assert request.slots.keep[0].sum(axis=0).tolist() == [0.9 * 1 + 1, 0]
    assert request.slots.watch[0, 0, 0] == 1


def test_a_sized_tree_step_verifies_the_likeliest_nodes_that_pay_and_learns_what_they_were_worth():
    request = Request(LookupDrafter(predictions=False), sized=True)
    request.start([1, 2, 3, 1, 2, 4, 1, 2])  # after [1, 2]: 3 or 4, each continued
    plan = request.commit_tree(request.propose(8, hedged=True), LineCost(1000.0))  # verifying nearly free: every node
    roots = plan.draft.token_ids[plan.draft.parents == -1].tolist()
    tree, nodes, estimates, table = request.estimates
    assert roots == [3, 4] and len(plan.draft) == nodes == len(tree) >= 4 and (np.diff(estimates) <= 0).all() and not table.any()
    assert len(request.commit_tree(request.propose(8, hedged=True), LineCost(0.1)).draft) == 0  # every token dear: a plain step
    assert plan.gain == 1.0  # not asked: only the tree trial reads it
    promised = request.commit_tree(request.propose(8, hedged=True), LineCost(1000.0), promise=True)
    assert promised.gain > 1.0 and promised.draft.token_ids.tolist() == plan.draft.token_ids.tolist()  # nearly free: more than the chain, the same tree
    request.discard()
    plan = request.commit_tree(request.propose(8, hedged=True), LineCost(1000.0))
    before = request.drafter.tree_chances.nodes.sum()
    request.verified([4, 1, 7], accepted=2)  # the model kept 4, 1 and wrote 7
    assert request.drafter.tree_chances.nodes.sum() == before + len(plan.draft) and request.estimates is None
    assert request.stats.accepted == 2


def test_a_step_tells_its_verified_nodes_and_their_frontier():
    # 3 -> 5 -> 8, 4 -> 6, 4 -> 5; the step verified the first two nodes (3 and 4)
    tree = Draft(np.array([3, 4, 5, 6, 5, 8]), np.array([-1, -1, 0, 1, 1, 2]))
    estimates, table = np.array([0.0, 0.02, 0.05, 0.2, 0.5, 0.0]), np.array([False] * 5 + [True])  # a cell of its own each

    def told(nodes, written, kept):  # the nodes counted, and those counted as written
        chances = TreeChances()
        chances.observe(tree.parents, nodes, len(written) > kept, on_path(tree, written[: kept + 1]), estimates, table)
        cells = [(0, band) for band in range(5)] + [(1, 0)]
        return [i for i, cell in enumerate(cells) if chances.nodes[cell]], [i for i, cell in enumerate(cells) if chances.error[cell] > 0]

    told_nodes, written = told(2, [4, 5], kept=1)  # kept 4, then wrote 5: 4 -> 5 written, 4 -> 6 and 3 -> 5 not
    assert told_nodes == [0, 1, 2, 3, 4] and written == [1, 4]  # 8: its parent unverified
    told_nodes, written = told(2, [4], kept=1)  # stopped after 4: the model's next token untold, so no frontier
    assert told_nodes == [0, 1] and written == [1]
    told_nodes, written = told(0, [3], kept=0)  # a plain step still tells the root's children
    assert told_nodes == [0, 1] and written == [0]


def test_tree_chances_learn_exactly_what_the_reference_counts():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(0, 24))
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)], dtype=np.int64)
        tree = Draft(rng.integers(0, 3, n), parents)
        nodes, kept = int(rng.integers(0, n + 1)), int(rng.integers(0, 4))
        written = rng.integers(0, 3, int(rng.integers(0, kept + 2))).tolist()
        estimates, table = rng.random(n) ** 3, rng.random(n) < 0.3
        chances = TreeChances()
        chances.cells[:] = rng.random(chances.cells.shape)
        before = chances.cells.copy()
        on = on_path(tree, written[: kept + 1])
        chances.observe(parents, nodes, len(written) > kept, on, estimates, table)
        cells, on_reference = told_reference(parents, tree.token_ids, nodes, written, kept, estimates, table, TREE_BANDS)
        assert on.tolist() == on_reference
        expected = before.copy()
        for (source, band), (count, error) in cells.items():
            expected[0, source, band] += count
            expected[1, source, band] += error
        assert np.allclose(chances.cells, expected, rtol=0, atol=1e-12)
        assert on[: nodes].tolist() == on_path(Draft(tree.token_ids[:nodes], parents[:nodes]), written[: kept + 1]).tolist()


def test_a_sized_tree_step_learns_from_the_nodes_it_did_not_buy():
    request = Request(LookupDrafter(predictions=False), sized=True)
    request.start([1, 2, 3, 1, 2, 4, 1, 2])
    plan = request.commit_tree(request.propose(8, hedged=True), LineCost(0.1))  # every token dear: a plain step
    tree, _, estimates, _ = request.estimates
    roots = np.flatnonzero(tree.parents == -1)
    assert len(plan.draft) == 0 and len(tree) >= 4 and tree.token_ids[roots].tolist() in ([3, 4], [4, 3])
    request.verified([4])  # the model wrote 4: of the root's children, 4 written, 3 not
    chances = request.drafter.tree_chances
    assert chances.nodes.sum() == 2  # the frontier alone: nothing deeper
    assert chances.error.sum() == pytest.approx((tree.token_ids[roots] == 4).sum() - estimates[roots].sum())


def test_on_path_marks_the_nodes_a_step_kept():
    tree = Draft(np.array([3, 4, 5, 6, 5]), np.array([-1, -1, 0, 1, 1]))  # 3 -> 5, 4 -> 6, 4 -> 5
    assert on_path(tree, [4, 5]).tolist() == [False, True, False, False, True]
    assert on_path(tree, []).tolist() == [False] * 5
    assert on_path(tree, [3]).tolist() == [True, False, False, False, False]


def test_unsized_requests_verify_whole_drafts():
    request = Request(LookupDrafter(memory=False), sized=False)
    request.start([1, 2, 3, 4, 1, 2])
    assert request.slots is None and request.keep_chance(request.propose(8)) == 1.0
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


@pytest.mark.parametrize("seed", range(6))
def test_the_engines_keep_rate_is_the_mirrors(seed):
    """A request's keep rate, learnt by the engine's kernels (learn_row, settle_row), equals the plain-Python
    mirror's (tests.reference.KeepRate) over random steps: drafts kept in part, trimmed by a server (checked),
    discarded, tokens that came outside a plan, more rests watched than MAX_WATCHED."""
    rng = random.Random(seed)
    motif = [rng.randrange(1, 6) for _ in range(rng.randrange(3, 6))]
    noise = 0.2 if seed % 2 else 0.0  # (no noise: long chains agree, and plain steps leave many rests watched)
    truth = [t if rng.random() > noise else rng.randrange(1, 8) for t in (motif * 100)[:300]]
    request = Request(LookupDrafter(memory=False, num_draft_tokens=12), sized=True)
    request.start(truth[:6])
    mirror, most_watched = KeepRate(request.drafter.max_ngram, max_watched=kernels.MAX_WATCHED), 0
    while request.drafter.num_tokens < len(truth) - 14:
        n = request.drafter.num_tokens
        action = rng.random()
        if action < 0.1:  # tokens outside a plan
            request.extend(truth[n : n + 2])
            mirror.settle(truth[: n + 2])
            continue
        chain = request.propose(12)
        size = 0 if rng.random() < (0.5 if noise else 0.95) else rng.randrange(len(chain) + 1)
        request.commit(chain, size)
        if action < 0.2:  # a server dropped the draft
            request.discard()
            continue
        kept = 0
        while kept < size and chain.token_ids[kept] == truth[n + kept]:
            kept += 1
        written = truth[n : n + kept + 1]
        checked = rng.randrange(size + 1) if action < 0.35 else None  # a server trimmed the draft to `checked`
        if checked is not None and checked < kept:
            written = truth[n : n + checked + 1]
        request.verified(written, checked=checked)
        if len(chain) and not (checked == 0 and size > 0):  # (sent, none verified: dropped unlearnt, as learn_row drops it)
            mirror.observe(chain.match_len, chain.token_ids.tolist(), size if checked is None else checked, written, n)
        mirror.settle(truth[: n + len(written)])
        assert request.slots.keep[0, :, 0].tolist() == pytest.approx(mirror.kept), n
        assert request.slots.keep[0, :, 1].tolist() == pytest.approx(mirror.failed), n
        assert request.slots.watch[0, 0, 0] == len(mirror.watched)
        assert request.keep_chance(chain) == pytest.approx(mirror.keep_chance(chain.match_len))
        most_watched = max(most_watched, len(mirror.watched))
    assert most_watched == kernels.MAX_WATCHED or seed % 2  # the cap was reached (seeds without noise)
