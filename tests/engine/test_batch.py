"""engine.batch.Batch, driven by LookupProposer over a fake runner (tests/fake_runner.py): drafts, sizes and keep
rates equal the per-request classes' (tests/reference.py's ReferenceProposer), requests retire in arrival order,
a queued call keeps its slots alive, and a finished request's state goes with it.
"""

import random
from types import SimpleNamespace

import pytest

from lookahead.integrations.vllm import LookupProposer
import lookahead.engine.batch as batch_module
import lookahead.integrations.vllm.proposer as proposer_module
from tests.fake_runner import A, B, C, FakeRunner, fake_config, new_proposer
from tests.engine.test_documents import large_library
from tests.reference import ReferenceProposer


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


def test_token_chances_false_drafts_the_same_chains_and_refuses_the_gate():
    # a caller that sizes from keep_chances alone (BatchDrafts) skips pricing each token: the chains are the same
    import numpy as np

    from lookahead.documents import DocumentLibrary
    from lookahead.engine.batch import Batch

    rng = np.random.default_rng(0)
    rows = [np.tile(rng.integers(0, 9, 7), 6)[: 30 + 3 * r] for r in range(3)]  # repeating rows: every one drafts
    tokens = np.zeros((3, 64), dtype=np.int64)
    for r, row in enumerate(rows):
        tokens[r, : len(row)] = row
    num_tokens = np.array([len(row) for row in rows], dtype=np.int64)
    chains = {}
    for priced in (True, False):
        batch = Batch(rows=3, num_draft_tokens=8, max_model_len=64, min_ngram=1, max_ngram=4, draft_factor=2.0, memory=None,
                      documents=DocumentLibrary(), token_chances=priced, thread=False)
        slots, _ = batch.slots_of([0, 1, 2], num_tokens, tokens)
        batch.begin(slots, num_tokens, np.ones(3, dtype=np.int64), np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64), tokens)
        batch.out_chance[:] = -1.0
        batch.advance(bar=0.0, force=True)
        chains[priced] = [batch.out_ids[r, : batch.out_len[r]].tolist() for r in range(3)]
        assert all(chains[priced]) and ((batch.out_chance[:, 0] == -1.0) != priced).all()
        if not priced:
            with pytest.raises(ValueError, match="token_chances=True"):
                batch.advance(bar=0.5, force=False)
    assert chains[True] == chains[False]
