"""TokenStore (cross-request memory, documents): matching, eviction, threads, save and load."""

import numpy as np
import pytest

from lookahead import LookupDrafter, StoreFileError, TokenStore
from lookahead.index import SEPARATOR
from lookahead.trie import DraftTrie
from tests import reference
from tests.threads import run_in_threads


def continuation(store: TokenStore, query, num_draft_tokens: int = 8) -> tuple[int, list[int]]:
    """(match_len, continuation) the store adds to a draft trie for `query`: the drafter's path."""
    trie = DraftTrie()
    match_len = store.add_continuation(trie, np.asarray(query, dtype=np.int64), num_draft_tokens, match_base=2.0, scale=0.5)
    return match_len, trie.path(num_draft_tokens).tolist()


def test_continuation_follows_the_most_recent_longest_match_and_stops_at_the_sequence_end():
    store = TokenStore(min_ngram=1, max_ngram=4)
    store.add([1, 2, 3, 4, 5])
    store.add([9, 2, 3, 7])
    assert continuation(store, [8, 2, 3]) == (2, [7])  # the newer sequence; no token of a neighbour
    assert continuation(store, [1, 2, 3]) == (3, [4, 5])
    assert continuation(store, [6])[0] == 0


def test_store_continuations_equal_brute_force_over_random_sequences():
    rng = np.random.default_rng(0)
    store = TokenStore(min_ngram=1, max_ngram=5)
    sequences = []
    for _ in range(30):
        seq = rng.integers(0, 6, rng.integers(1, 30)).tolist()
        store.add(seq)
        sequences.append(seq)
    assert [s.tolist() for s in store.sequences()] == sequences
    trie = DraftTrie()
    for _ in range(200):
        query = rng.integers(0, 6, 5)
        trie.clear()
        match_len = store.add_continuation(trie, query.astype(np.int32), 6, match_base=2.0, scale=0.5)
        expected_len, expected = reference.store_continuation(sequences, query.tolist(), 1, 5, 6)
        assert match_len == expected_len
        assert trie.path(6).tolist() == expected  # one path: the continuation, cut at the sequence end
        ids, parents, weights = trie.nodes()
        assert ids.tolist() == expected and (weights == 0.5 * 2.0**match_len).all()


def test_eviction_keeps_the_newest_sequences_under_the_cap():
    store = TokenStore(max_tokens=100, min_ngram=1, max_ngram=3)
    for i in range(40):
        store.add([1000 + i, 1, 2, 3, 2000 + i])
        assert len(store) <= 100
    assert continuation(store, [1000 + 39], 4) == (1, [1, 2, 3, 2039])
    assert continuation(store, [1000 + 0], 4)[0] == 0  # the oldest is gone
    assert store.sequences()[-1].tolist() == [1039, 1, 2, 3, 2039]


def test_concurrent_adds_and_queries_from_threads():
    store = TokenStore(max_tokens=5_000, min_ngram=1, max_ngram=4)

    def writer(seed):
        rng = np.random.default_rng(seed)
        for _ in range(200):
            store.add(rng.integers(0, 50, 40))

    def reader(seed):
        rng = np.random.default_rng(seed)
        for _ in range(2_000):
            match_len, ids = continuation(store, rng.integers(0, 50, 4), 8)
            assert 0 <= match_len <= 4 and len(ids) <= 8 and all(t < 50 for t in ids)

    run_in_threads(*[lambda i=i: writer(i) for i in range(3)], *[lambda i=i: reader(10 + i) for i in range(3)])
    assert len(store) <= 5_000


def test_a_worker_that_raises_fails_the_test():
    def boom():
        raise KeyError("worker failed")

    with pytest.raises(KeyError, match="worker failed"):
        run_in_threads(lambda: None, boom)


def test_save_and_load_round_trip(tmp_path):
    store = TokenStore(max_tokens=1000, min_ngram=1, max_ngram=4)
    store.add([1, 2, 3, 4])
    store.add([5, 2, 3, 9])
    store.save(tmp_path / "s.npz")
    loaded = TokenStore.load(tmp_path / "s.npz")
    assert (loaded.max_tokens, loaded.num_sequences, len(loaded)) == (1000, 2, len(store))
    assert [s.tolist() for s in loaded.sequences()] == [[1, 2, 3, 4], [5, 2, 3, 9]]
    for query in ([2, 3], [1, 2, 3], [7]):
        assert continuation(store, query, 4) == continuation(loaded, query, 4)


def _corrupt(path, header=None, tokens=None):
    import json

    with np.load(path) as data:
        h = json.loads(bytes(data["header"]).decode())
        t = data["tokens"]
    if header:
        h.update(header)
    if tokens is not None:
        t = tokens
    with open(path, "wb") as f:
        np.savez(f, header=np.frombuffer(json.dumps(h).encode(), dtype=np.uint8), tokens=t)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.write_bytes(p.read_bytes()[:40]), "not a lookahead store file"),
        (lambda p: p.write_bytes(b"hello"), "not a lookahead store file"),
        (lambda p: np.savez(p, x=np.arange(3)), "not a lookahead store file"),
        (lambda p: _corrupt(p, header={"format": "other"}), "format 'other'"),
        (lambda p: _corrupt(p, header={"version": 99}), "version 99"),
        (lambda p: _corrupt(p, tokens=np.array([1, 2, 3], dtype=np.int32)), "corrupt"),
        (lambda p: _corrupt(p, header={"starts": [0, 3, 1]}), "corrupt"),
    ],
    ids=["truncated", "garbage", "foreign_npz", "foreign_format", "future_version", "tokens_cut", "starts_unsorted"],
)
def test_bad_store_files_are_refused(tmp_path, damage, message):
    path = tmp_path / "s.npz"
    store = TokenStore()
    store.add([1, 2, 3])
    store.add([4, 5])
    store.save(path)
    damage(path)
    with pytest.raises(StoreFileError, match=message):
        TokenStore.load(path)


def test_missing_store_file(tmp_path):
    with pytest.raises(StoreFileError, match="no such file"):
        TokenStore.load(tmp_path / "none.npz")


def test_bad_store_input():
    with pytest.raises(ValueError, match="max_tokens"):
        TokenStore(max_tokens=3)
    store = TokenStore()
    with pytest.raises(ValueError, match=str(SEPARATOR)):
        store.add([SEPARATOR])


def test_drafter_copies_from_documents_and_prefers_its_own_context():
    drafter = LookupDrafter(num_draft_tokens=4, memory=False)
    drafter.add_document([50, 51, 52, 53, 54, 55])
    drafter.reset([7, 8, 51, 52])
    assert drafter.propose().token_ids.tolist() == [53, 54, 55]
    drafter.reset([51, 52, 9, 9, 51, 52])  # own context has [51, 52] too: it wins
    assert drafter.propose().token_ids.tolist() == [9, 9, 51, 52]


def test_drafter_remembers_earlier_requests():
    memory = TokenStore()
    first, second = LookupDrafter(memory=memory), LookupDrafter(memory=memory)
    first.reset([1, 2, 3])
    first.extend([40, 41, 42, 43, 44])
    first.reset([9])  # files the first request into the shared memory
    second.reset([5, 40, 41])
    assert second.propose().token_ids.tolist() == [42, 43, 44]


def test_add_document_from_text_with_a_tokenizer():
    class Tokenizer:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}

    drafter = LookupDrafter(memory=False)
    drafter.add_document(text="hello world", tokenizer=Tokenizer())
    drafter.reset([ord(c) for c in "say hel"])
    assert drafter.propose().token_ids.tolist()[:2] == [ord("l"), ord("o")]


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(), "exactly one"), (dict(token_ids=[1], text="a"), "exactly one"), (dict(text="a"), "needs tokenizer")],
)
def test_add_document_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LookupDrafter().add_document(**kwargs)


def test_memory_must_be_a_store_or_bool():
    with pytest.raises(TypeError, match="memory must be"):
        LookupDrafter(memory=[1, 2])


def test_generate_calls_in_threads_share_one_memory_and_stay_exact():
    import torch

    from tests.models import stories_model

    model = stories_model()
    memory = TokenStore()
    prompts = [[1] + model.generate(torch.tensor([[1, t]]), max_new_tokens=20, do_sample=False)[0, 1:].tolist() for t in (30, 40, 50, 60)]
    expected = [model.generate(torch.tensor([p]), max_new_tokens=30, do_sample=False).tolist() for p in prompts]
    results = {}

    def worker(i):
        drafter = LookupDrafter(memory=memory)  # one drafter per thread, one memory for all
        for _ in range(2):
            results[i] = model.generate(torch.tensor([prompts[i]]), max_new_tokens=30, do_sample=False, assistant_model=drafter).tolist()

    run_in_threads(*[lambda i=i: worker(i) for i in range(len(prompts))])
    assert [results[i] for i in range(len(prompts))] == expected
    assert memory.num_sequences >= len(prompts)  # each second call filed its first request
