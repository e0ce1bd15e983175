"""engine.trees: a batch's trees, drafted for every row in one kernel call, equal what a LookupDrafter drafts for each row."""

import numpy as np
import pytest

from lookahead import LookupDrafter, PredictionTable, TokenStore
from lookahead.documents import DocumentLibrary
from lookahead.engine import trees as trees_module
from lookahead.integrations.batch_drafts import BatchDrafts

K, MAX_TREE_NODES, VOCAB = 12, 24, 40


def _drafter(table, memory, documents, **options) -> LookupDrafter:
    return LookupDrafter(num_draft_tokens=K, max_ngram=4, predictions=table, memory=memory, documents=documents,
                         eos_token_id=[0], vocab_size=VOCAB - 2, **options)


def _fill(table: PredictionTable, rng) -> None:
    inputs = rng.integers(0, VOCAB, size=3 * VOCAB)
    table.record(inputs, rng.integers(0, VOCAB, size=(inputs.shape[0], table.k)))


@pytest.mark.parametrize("seed", range(6))
def test_a_batchs_trees_and_hedged_chains_equal_each_rows_drafter(seed):
    """Every step, each row's hedged chain (advance_trees) and unsized tree (grow_trees: the max_tree_nodes heaviest,
    blended) equal LookupDrafter.propose(hedged=True) and propose_tree on the row's tokens with a drafter of the same
    options, memory, documents and table; the lead and rank chances each row learns (observe_trees) keep them equal."""
    rng = np.random.default_rng(seed)
    memory = TokenStore(min_ngram=1, max_ngram=4)
    memory.add(rng.integers(1, 12, size=80).tolist())
    documents = DocumentLibrary()
    documents.add(rng.integers(1, 12, size=60).tolist())
    ours_table, their_table = PredictionTable(), PredictionTable()
    fill = np.random.default_rng(seed + 100)
    _fill(ours_table, fill)
    _fill(their_table, np.random.default_rng(seed + 100))
    drafter = _drafter(ours_table, memory, documents, cost_aware=False)
    drafter.eos_token_ids, drafter.vocab_size = {0}, VOCAB - 2
    prompts = [rng.integers(1, 12, size=int(rng.integers(8, 40))).tolist() for _ in range(3)]
    max_len = 80
    batch = BatchDrafts(drafter, prompts, max_len)
    theirs = [_drafter(their_table, memory, documents, cost_aware=False) for _ in prompts]
    for row, prompt in zip(theirs, prompts):
        row.eos_token_ids, row.vocab_size = {0}, VOCAB - 2
        row.reset(prompt)
    contexts = [list(p) for p in prompts]
    drafted = 0
    for step in range(6):
        rooms = [min(K, max_len - len(c) - 1) for c in contexts]
        drafts = batch.plan(rooms, None, first=False, tree=True, max_tree_nodes=MAX_TREE_NODES)
        for i, (row, room) in enumerate(zip(theirs, rooms)):
            chain = row.propose(room, hedged=True)
            n = int(batch.engine.out_len[i])
            assert batch.engine.out_ids[i, :n].tolist() == chain.token_ids.tolist(), (seed, step, i)
            assert int(batch.engine.out_match[i]) == chain.match_len if n else True
            tree = row.propose_tree(room, max_tree_nodes=MAX_TREE_NODES)
            assert drafts[i].token_ids.tolist() == tree.token_ids.tolist(), (seed, step, i)
            assert drafts[i].parents.tolist() == tree.parents.tolist()
            assert drafts[i].sources.tolist() == tree.sources.tolist()
            drafted += len(tree)
        # each row writes a few tokens: the first of its tree's first branch where it has one (its lead kept), or not
        written = []
        for i, draft in enumerate(drafts):
            new = rng.integers(1, 12, size=int(rng.integers(1, 4))).tolist()
            if len(draft) and step % 2 == 0:
                new[0] = int(draft.token_ids[0])
            written.append(new)
            batch.verified(i, new, 0)
            contexts[i] += new
        inputs = [rng.integers(1, 12, size=2).tolist() for _ in prompts]
        predicted = [rng.integers(1, 12, size=(2, ours_table.k)) for _ in prompts]
        batch.learnt(inputs, predicted)
        for row, new in zip(theirs, written):  # every row extends before any records, as the batch does
            row.extend(new)
        for row, row_inputs, row_predicted in zip(theirs, inputs, predicted):
            row._record_predictions(row_inputs, row_predicted)
        for i, row in enumerate(theirs):
            t = batch.trees
            assert t.hits[i].tolist() == pytest.approx(row.lead_chances.hits.tolist())
            assert t.ranks[i].tolist() == pytest.approx(row.rank_chances.counts.tolist())
    assert drafted > 0 and batch.trees.ranks.sum() > 0 and batch.trees.hits.sum() > 0


def test_grow_trees_takes_lookups_nodes_first_when_sized():
    """Sized, a row's tree is its heaviest nodes with lookup's before the table's (LookupDrafter._grow_tree)."""
    rng = np.random.default_rng(7)
    table = PredictionTable()
    _fill(table, rng)
    prompt = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 9, 1, 2, 3]
    drafter = _drafter(table, False, None, cost_aware=True)
    drafter.eos_token_ids, drafter.vocab_size = {0}, VOCAB - 2
    batch = BatchDrafts(drafter, [prompt], 40)
    batch.plan([K], None, first=True, tree=True)  # fills the row's trie (sized to 0 tokens: no cost needed)
    row = _drafter(PredictionTable(), False, None, cost_aware=True)
    row.predictions.record(*_copy(table))
    row.eos_token_ids, row.vocab_size = {0}, VOCAB - 2
    row.reset(prompt)
    row.propose(K, hedged=True)
    for nodes in (1, 3, 8):
        ids, parents, origins, lengths = batch.trees.grow(np.array([nodes]), MAX_TREE_NODES, lookup_first=True)
        tree = row._grow_tree(nodes)
        assert 0 < lengths[0] <= nodes
        assert ids[0, : lengths[0]].tolist() == tree.token_ids.tolist() and parents[0, : lengths[0]].tolist() == tree.parents.tolist()


def _copy(table: PredictionTable):
    rows = np.flatnonzero(table.ids[:, 0] >= 0)
    return rows, table.ids[rows]


def test_observe_ranks_against_the_table_before_the_step_records():
    """A row's written token is ranked in the table's row for the token before it as the table was before the step
    that wrote it recorded its own predictions (observe_trees runs before the records: BatchDrafts.learnt)."""
    table = PredictionTable()
    table.record([5], [[7] + [1] * (table.k - 1)])  # after 5, 7 at rank 0
    drafter = _drafter(table, False, None, cost_aware=False)
    batch = BatchDrafts(drafter, [[3, 4, 5]], 20)
    batch.plan([4], None, first=False, tree=True)
    assert batch.trees.read[0]
    batch.verified(0, [7], 0)
    batch.learnt([[5]], [np.array([[8] + [1] * (table.k - 1)])])  # the step's own record moves 8 to rank 0 after 5
    assert batch.trees.ranks[0, 0] == 1 and table.ids[5, 0] == 8
    assert trees_module.TREES_READ == len(batch.trees.arrays()) - 4  # the group's constants follow arrays()' order
