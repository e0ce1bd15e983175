"""The prediction table, its rank chances and the trie's best-first expansion of it, against pure-Python references."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead import LookupDrafter, PredictionTable
from lookahead import predictions as predictions_module
from lookahead import trie as trie_module
from lookahead.draft import Draft
from lookahead.drafter import CARRY
from lookahead.predictions import TREE_PRIOR_ERROR, TREE_PRIOR_NODES, TreeChances
from lookahead.request import on_path
from lookahead.trie import DraftTrie
from tests.reference import reference_expansion, reference_ranks, reference_record
from tests.test_trie import node_weights


def test_warm_up_compiles_every_kernel():
    assert predictions_module.warm_up() == 2
    assert trie_module.warm_up() == 4
    for kernel in (predictions_module.record_rows, predictions_module.rank_counts, trie_module.add_predictions):
        assert kernel.signatures, f"{kernel.__name__} was not compiled"


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.lists(st.tuples(st.integers(0, 9), st.lists(st.integers(-1, 11), min_size=3, max_size=3)), max_size=6),
                      max_size=5),
       k=st.integers(1, 3), dtype=st.sampled_from([np.int32, np.int64]))
def test_record_keeps_the_last_prediction_per_input_and_grows_to_every_id(steps, k, dtype):
    table, expected = PredictionTable(k=k), {}
    for step in steps:  # (-1: none, as top_ids writes where a row has fewer than k numbers)
        inputs = [t for t, _ in step]
        predicted = np.array([ids for _, ids in step], dtype=dtype).reshape(len(step), 3)
        table.record(inputs, predicted)
        reference_record(expected, inputs, predicted.tolist(), k)
    seen = {t for step in steps for t, ids in step} | {i for step in steps for _, ids in step for i in ids[:k] if i >= 0}
    assert len(table) == (max(seen) + 1 if seen else 0)  # a row for every id recorded, input or predicted
    assert table.nbytes == len(table) * k * 4  # int32: vocab x k x 4 bytes at most
    for t in range(len(table) + 2):
        assert table.row(t).tolist() == expected.get(t, [-1] * k)


def test_record_refuses_a_shape_that_does_not_match():
    table = PredictionTable(k=4)
    with pytest.raises(ValueError, match="predicted must be"):
        table.record([1, 2], np.zeros((3, 4)))
    with pytest.raises(ValueError, match="predicted must be"):
        table.record([1, 2], np.zeros(2))
    table.record([1], np.array([[3, 2]]))  # fewer than k: the rest of the row is none
    assert table.row(1).tolist() == [3, 2, -1, -1]
    with pytest.raises(ValueError, match="k must be"):
        PredictionTable(k=0)


@settings(max_examples=200, deadline=None)
@given(rows=st.dictionaries(st.integers(0, 5), st.permutations(range(6)).map(lambda p: list(p[:2])), max_size=6),
       tokens=st.lists(st.integers(0, 5), max_size=20), start=st.integers(0, 20))
def test_rank_counts_equal_the_reference(rows, tokens, start):
    table = PredictionTable(k=2)
    table.reserve(6)
    if rows:
        table.record(list(rows), np.array(list(rows.values())))
    counts = np.zeros(3, dtype=np.int64)
    predictions_module.rank_counts(table.ids, np.array(tokens, dtype=np.int32), start, counts)
    assert counts.tolist() == reference_ranks(rows, tokens, start, 2)


@settings(max_examples=300, deadline=None)
@given(rows=st.dictionaries(st.integers(0, 4), st.permutations(range(5)).map(lambda p: list(p[:3])), max_size=5),
       root=st.integers(0, 4), budget=st.integers(1, 30), max_depth=st.integers(1, 4),
       chances=st.sampled_from([(0.5, 0.3, 0.1), (0.6, 0.0, 0.2), (0.9, 0.05, 0.01)]),
       eos=st.sampled_from([(), (2,)]), vocab_limit=st.sampled_from([trie_module.NO_VOCAB_LIMIT, 4]),
       scale=st.sampled_from([1.0, 3.0]), lookup=st.lists(st.integers(0, 4), max_size=4))
def test_the_tables_best_first_expansion_takes_the_likeliest_paths(rows, root, budget, max_depth, chances, eos, vocab_limit, scale,
                                                                    lookup):
    table = PredictionTable(k=3)
    table.reserve(5)
    if rows:
        table.record(list(rows), np.array(list(rows.values())))
    trie = DraftTrie()
    trie.eos = np.array(eos, dtype=np.int64)
    trie.vocab_limit = vocab_limit
    trie.add(np.array(lookup, dtype=np.int64), np.array([0]), np.array([1.0]), 4)  # a lookup candidate already there
    before = node_weights(trie)
    trie.add_predictions(table.ids, root, np.array(chances), budget=budget, max_depth=max_depth, scale=scale)
    after = node_weights(trie)
    added = {path: after[path] - before.get(path, 0.0) for path in after if after[path] != before.get(path, 0.0)}
    possible = reference_expansion(rows, root, chances, budget, max_depth, eos, vocab_limit)
    assert set(added) <= set(possible)
    assert added == pytest.approx({path: scale * possible[path] for path in added})
    assert len(added) == min(budget, len(possible))
    # the likeliest: nothing left out is likelier than what was taken
    if len(added) < len(possible):
        assert min(added.values()) / scale >= max(p for path, p in possible.items() if path not in added) - 1e-12
    # weights still only shrink along a path (heaviest_nodes' subtree property)
    for path, w in after.items():
        assert len(path) == 1 or after[path[:-1]] >= w - 1e-12


def learnt_drafter(**options) -> LookupDrafter:
    """A drafter whose table has seen the model predict 5 -> (6, 7), 6 -> (2, 8), 7 -> (9,), 8 -> (3,)."""
    drafter = LookupDrafter(memory=False, eos_token_id=2, vocab_size=9, **options)
    drafter.reset([1, 4])
    drafter._record_predictions([5, 6, 7, 8], np.array([[6, 7], [2, 8], [9, 1], [3, 4]]))
    return drafter


def test_the_drafter_drafts_the_tables_continuation_where_lookup_has_none():
    drafter = learnt_drafter()
    drafter.extend([5])  # 5 never occurred before: lookup has nothing; the table knows what follows 5
    chain = drafter.propose(4, hedged=True)  # a tree step's chain; a plain chain is lookup's alone
    assert chain.token_ids.tolist() == [6, 8, 3] and chain.match_len == 0  # 2 is EOS: 6 -> 8 (rank 1), then 3 (rank 0)
    tree = drafter.propose_tree(4, max_tree_nodes=8)
    assert set(tree.token_ids.tolist()) <= {6, 7, 8, 3, 4, 1} and 2 not in tree.token_ids.tolist()
    assert 9 not in tree.token_ids.tolist()  # at or above vocab_size: never drafted, wherever it comes from


def test_predictions_false_or_lookup_alone():
    drafter = LookupDrafter(memory=False, predictions=False)
    assert drafter.predictions is None
    drafter.reset([1, 4])
    drafter._record_predictions([5], np.array([[6, 7]]))  # nothing to record into
    drafter.extend([5, 6, 5])
    assert drafter.propose(4).token_ids.tolist() == [6, 5]  # lookup alone: what followed the last 5
    table_alone = learnt_drafter()
    table_alone.lookup = False
    table_alone.extend([5, 6, 5])
    assert table_alone.propose(4, hedged=True).token_ids.tolist() == [6, 8, 3]
    assert len(table_alone.propose(4)) == 0  # a plain chain takes no table paths


def test_a_whole_tree_weighs_lookup_by_how_its_first_tokens_have_held_and_a_sized_step_drafts_lookup_first():
    for held, heaviest in ((True, 3), (False, 6)):
        drafter = learnt_drafter()
        drafter.extend([0, 5, 3, 3, 3, 0, 5])  # [0, 5] occurred, followed by 3: a 2-token match; the table says 6 after 5
        for _ in range(10):  # what lookup's first tokens at this match length did before
            drafter.lead_chances.drafted(2, 3)
            drafter.lead_chances.written(3 if held else 4)
        tree = drafter.propose_tree(3, max_tree_nodes=1)  # unsized: the one heaviest node, by weight
        assert tree.token_ids.tolist() == [heaviest]
        chain = drafter.propose(3, hedged=True)  # sized: lookup's chain whenever it has one
        assert chain.token_ids.tolist()[0] == 3 and chain.match_len == 2
        assert drafter._grow_tree(1).token_ids.tolist() == [3]  # and lookup's nodes before the table's alone
        assert 6 in drafter._grow_tree(8).token_ids.tolist()  # the table's fill what lookup leaves


def test_rank_chances_count_what_the_model_wrote_against_the_table_before_the_step():
    drafter = learnt_drafter()
    drafter.extend([5, 7, 1])  # 5 -> 7: rank 1; 7 -> 1: rank 1 of (9, 1); 4 -> 5: no row for 4
    counts = drafter.rank_chances.counts.tolist()  # ranks 0..7, then none
    assert counts == [0, 2] + [0] * 7
    chances = drafter.rank_chances.chances()
    assert chances[1] > chances[0] * 0.5 and chances.sum() < 1.0
    drafter.lead_chances.drafted(2, 3)
    drafter.lead_chances.written(3)
    drafter.reset([3])  # a new request: the counts carried at a share, the table itself kept
    assert drafter.rank_chances.counts.tolist() == [0, 2 * CARRY] + [0] * 7
    assert drafter.lead_chances.hits[2] == CARRY and drafter.lead_chances.seen[2] == CARRY and drafter.lead_chances.pending is None
    assert drafter.predictions.row(5).tolist()[:2] == [6, 7]


def test_ranks_are_counted_after_drafts_that_read_the_table_and_not_after_plain_chains():
    drafter = learnt_drafter()
    drafter.propose(4)  # a plain chain reads no table (PREDICTION_CHAIN_NODES): nor is what follows it counted
    drafter.extend([5, 7])
    assert not drafter.rank_chances.counts.any() and drafter.lead_chances.pending is None
    drafter.propose(4, hedged=True)  # a tree step's chain reads it
    drafter.extend([9])  # 7 -> 9: rank 0
    assert drafter.rank_chances.counts.tolist() == [1] + [0] * 8


def test_a_table_can_be_shared():
    table = PredictionTable()
    assert LookupDrafter(predictions=table).predictions is table and LookupDrafter(predictions=table).predictions is table
    with pytest.raises(TypeError, match="predictions must be"):
        LookupDrafter(predictions="yes")


class RecordingTable(PredictionTable):
    """A PredictionTable that keeps every (inputs, predicted) the loop records."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def record(self, inputs, predicted):
        self.calls.append((list(inputs), np.asarray(predicted).copy()))
        super().record(inputs, predicted)


def assert_top_k_of_the_block(model, prompt, output, calls):
    """Each step recorded a chain block [last own token, draft...]: its entries' top-k equal a fresh
    forward's over the row's sequence before the block and the block's entries."""
    import torch

    sequence = prompt + output
    position = len(prompt) - 1  # the first step's entries start at the prompt's last token
    for inputs, predicted in calls:
        assert sequence[position] == inputs[0]
        with torch.no_grad():
            logits = model(torch.tensor([sequence[:position] + inputs])).logits[0, position:].float()
        top = logits.topk(predicted.shape[1]).values
        assert torch.allclose(torch.gather(logits, 1, torch.from_numpy(predicted).long()), top, atol=1e-4)
        kept = 0
        while kept + 1 < len(inputs) and position + kept + 1 < len(sequence) and inputs[kept + 1] == sequence[position + kept + 1]:
            kept += 1
        position += kept + 1  # the kept drafts and the model's own token


def recorded_chain_call(monkeypatch, **options):
    """stories260K through lookahead.generate with unsized chains that read the table (so their blocks are
    recorded into a RecordingTable): (model, prompt, output ids, drafter, table)."""
    import torch

    from lookahead import drafter as drafter_module
    from lookahead import generate
    from tests.models import stories_model

    monkeypatch.setattr(drafter_module, "PREDICTION_CHAIN_NODES", 8)  # chains read the table: their blocks are recorded
    model = stories_model()
    table = RecordingTable()
    drafter = LookupDrafter(num_draft_tokens=6, cost_aware=False, predictions=table)
    prompt = [1] + model.generate(torch.tensor([[1]]), max_new_tokens=30, do_sample=False)[0, 1:20].tolist()
    out = generate(model, torch.tensor([prompt]), drafter=drafter, tree=False, max_new_tokens=40, do_sample=False, **options)
    return model, prompt, out[0, len(prompt):].tolist(), drafter, table


def test_the_loop_records_the_top_k_of_every_entry_of_the_block_rejected_drafts_included(monkeypatch):
    import torch

    model, prompt, output, drafter, table = recorded_chain_call(monkeypatch)
    assert output == model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0, len(prompt):].tolist()
    assert len(table.calls) == drafter.stats.steps
    assert any(len(inputs) > kept + 1 for (inputs, _), kept in zip(table.calls, drafter.stats.accepted_per_step))  # rejected entries
    assert_top_k_of_the_block(model, prompt, output, table.calls)  # the first step's from the prompt's last token on


def test_record_rejected_off_records_the_kept_path_alone(monkeypatch):
    import torch

    model, prompt, output, drafter, table = recorded_chain_call(monkeypatch, record_rejected=False)
    assert prompt + output == model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0].tolist()
    assert any(drafter.stats.drafted_per_step[i] > kept for i, kept in enumerate(drafter.stats.accepted_per_step))  # drafts were rejected
    # each step's entries: the row's last own token and the drafts the model kept, no rejected node
    assert [len(inputs) for inputs, _ in table.calls] == [kept + 1 for kept in drafter.stats.accepted_per_step]


def test_nothing_is_computed_for_the_table_when_predictions_are_off_or_no_draft_reads_it(monkeypatch):
    import torch

    from lookahead import generate
    from lookahead.integrations import generate as generate_module
    from tests.models import stories_model

    def refuse(*args):
        raise AssertionError("top_ids called with predictions=False")

    monkeypatch.setattr(generate_module, "top_ids", refuse)
    model = stories_model()
    drafter = LookupDrafter(predictions=False, cost_aware=False)
    generate(model, torch.tensor([[1, 5, 6, 7]]), drafter=drafter, max_new_tokens=8, do_sample=False)
    generate(model, torch.tensor([[1, 5, 6, 7]]), drafter=LookupDrafter(cost_aware=False), tree=False, max_new_tokens=8, do_sample=False)
    with pytest.raises(AssertionError, match="top_ids called"):
        generate(model, torch.tensor([[1, 5, 6, 7]]), drafter=LookupDrafter(cost_aware=False), max_new_tokens=8, do_sample=False)


def test_tree_chances_learn_what_each_band_of_estimates_keeps_per_source():
    chances = TreeChances()

    def corrected(estimates, table):
        _, bands, errors = chances.correction(0)
        return np.clip(estimates + errors[np.asarray(table, dtype=np.int64), np.searchsorted(bands, estimates, side="right")], 0, 1)

    estimates = np.array([0.002, 0.05, 0.5])
    prior = TREE_PRIOR_ERROR
    assert corrected(estimates, [0, 0, 1]).tolist() == pytest.approx([0.002 + prior[0], 0.05 + prior[2], 0.5 + prior[-1]])  # the prior's guess
    # 20 thin roots (100..119), the likely 100 -> 120 and the table's likely root 121, every node verified
    tree = Draft(np.arange(100, 122), np.array([-1] * 20 + [0, -1]))
    for _ in range(1000):  # thin nodes kept 5% of the time, the likely one half as often as estimated; the table's likely one never
        likely_kept = bool(_ % 2 and _ % 4 == 1)
        chances.observe(tree.parents, 22, True, on_path(tree, [100, 120, 7] if likely_kept else [100, 7]),
                        np.array([0.002] * 20 + [0.5, 0.5]), np.array([False] * 21 + [True]))
    assert corrected(estimates, [0, 0, 0]).tolist() == pytest.approx([0.05, 0.05 + prior[2], 0.25], abs=0.02)
    shrunk = (0.5 + prior[-1]) * TREE_PRIOR_NODES / (1000 + TREE_PRIOR_NODES)  # the table's: never kept, the prior's pull left
    assert corrected(np.array([0.002, 0.5]), [1, 1]).tolist() == pytest.approx([0.002 + prior[0], shrunk])
    assert corrected(np.array([0.001, 0.99]), [0, 1]).min() >= 0.0 and corrected(np.array([0.99]), [0]).max() <= 1.0
    assert chances.correction(7)[0] == 7
