"""TokenStore (cross-request memory, documents): matching, eviction, threads, save and load."""

import io
import json
import re
import multiprocessing
import os
import sys
import threading
import time
import tracemalloc
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead import LookupDrafter, StoreFileError, TokenStore
from lookahead.index import SEPARATOR
from lookahead.trie import DraftTrie
from tests import reference
from tests.threads import run_in_threads, start_threads


def continuation(store: TokenStore, query, num_draft_tokens: int = 8) -> tuple[int, list[int]]:
    """(match_len, continuation) the store adds to a draft trie for `query`: engine.chain's kernel, in Python."""
    trie = DraftTrie()
    match_len = add_continuation(store, trie, np.asarray(query, dtype=np.int64), num_draft_tokens)
    return match_len, trie.path(num_draft_tokens).tolist()


def add_continuation(store: TokenStore, trie: DraftTrie, query: np.ndarray, num_draft_tokens: int) -> int:
    """What engine.chain adds of a store (its longest match's continuation, cut at its sequence's end), into `trie`."""
    with store.reading() as index:
        return trie.add_longest_match(index, query, num_draft_tokens, match_base=2.0, scale=0.5, stop_token=SEPARATOR)


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
        match_len = add_continuation(store, trie, query.astype(np.int32), 6)
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


def test_file_kinds_are_checked_on_write_and_read(tmp_path):
    store = TokenStore()
    store.add([1, 2, 3])
    with pytest.raises(ValueError, match="'Store'"):
        store.write_file(tmp_path / "s.npz", kind="Store")
    assert not (tmp_path / "s.npz").exists()
    store.write_file(tmp_path / "s.npz", kind="DocumentLibrary")
    with pytest.raises(ValueError, match="'Store'"):
        TokenStore.read_file(tmp_path / "s.npz", kind="Store")
    with pytest.raises(StoreFileError, match="a DocumentLibrary file, not a TokenStore one"):
        TokenStore.load(tmp_path / "s.npz")
    assert [ids.tolist() for ids in TokenStore.read_file(tmp_path / "s.npz", kind="DocumentLibrary").sequences()] == [[1, 2, 3]]


def _corrupt(path, header=None, tokens=None):
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


def _unreadable(tmp_path, kind):
    if kind == "missing":
        return tmp_path / "none.npz"
    if kind == "directory":
        return tmp_path
    if kind == "under_a_file":
        (tmp_path / "file").write_bytes(b"")
        return tmp_path / "file" / "s.npz"
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    path = tmp_path / "s.npz"
    TokenStore().save(path)
    path.chmod(0)
    return path


@pytest.mark.parametrize(
    "kind, error",
    [("missing", FileNotFoundError), ("directory", IsADirectoryError), ("under_a_file", NotADirectoryError), ("no_permission", PermissionError)],
)
def test_an_unreadable_file_raises_its_os_error(tmp_path, kind, error):
    # Was: StoreFileError("not a lookahead store file (PermissionError ...)"), and "no such file" for a missing one.
    with pytest.raises(error):
        TokenStore.load(_unreadable(tmp_path, kind))


@pytest.mark.parametrize(
    "header, tokens, message",
    [
        ({"max_ngram": 99}, None, "max_ngram=99"),
        ({"min_ngram": 0}, None, "min_ngram=0"),
        ({"min_ngram": True}, None, "must be ints"),
        ({"max_tokens": 3}, None, "max_tokens must be an int >= 16, got 3"),
        ({"max_tokens": "many"}, None, "must be ints"),
        (None, np.array([1, 2, 2**40, SEPARATOR, 4, 5, SEPARATOR]), str(2**40)),
        (None, np.array([1, 2, -3, SEPARATOR, 4, 5, SEPARATOR]), "-3"),
        (None, np.array([1.0, 2, 3, SEPARATOR, 4, 5, SEPARATOR]), "1-D integer array"),
        (None, np.array([[1, 2, 3, SEPARATOR, 4, 5, SEPARATOR]]), "1-D integer array"),
    ],
    ids=["max_ngram_99", "min_ngram_0", "min_ngram_bool", "max_tokens_3", "max_tokens_str", "token_2**40", "token_negative", "float_tokens", "2d_tokens"],
)
def test_well_formed_files_with_bad_values_raise_store_file_error(tmp_path, header, tokens, message):
    # Were plain ValueErrors raised while building the store.
    path = tmp_path / "s.npz"
    store = TokenStore()
    store.add([1, 2, 3])
    store.add([4, 5])
    store.save(path)
    _corrupt(path, header=header, tokens=tokens)
    with pytest.raises(StoreFileError, match=re.escape(message)):
        TokenStore.load(path)


def test_load_refuses_more_tokens_than_the_files_max_tokens(tmp_path):
    path = tmp_path / "s.npz"
    store = TokenStore(max_tokens=20_000)
    for i in range(13):
        store.add(np.arange(980) + i)  # 13 * 981 = 12,753 tokens
    store.save(path)
    _corrupt(path, header={"max_tokens": 100})
    with pytest.raises(StoreFileError, match="12753 tokens, more than max_tokens=100"):
        TokenStore.load(path)


@pytest.mark.parametrize(
    "tokens, starts",
    [
        ([1, 2, 3, SEPARATOR, 4, 5, SEPARATOR], [0, 3]),  # shifted back onto a separator
        ([1, 2, 3, SEPARATOR, 4, 5, SEPARATOR], [0, 5]),  # shifted into a sequence
        ([1, 2, 3, SEPARATOR, 4, 5, SEPARATOR], [0]),  # one missing
        ([1, 2, 3, SEPARATOR, 4, 5, SEPARATOR], [0, 4, 6]),  # one too many
        ([1, 2, 3, SEPARATOR, 4, 5, SEPARATOR], [1, 4]),  # the first not at 0
        ([1, 2, 3, SEPARATOR, 4, 5], [0, 4]),  # the last sequence unterminated
        ([1, 2, 3, SEPARATOR, SEPARATOR], [0, 4]),  # an empty sequence: add() never stores one
        ([SEPARATOR, 4, 5, SEPARATOR], [0, 1]),
    ],
)
def test_sequence_starts_that_disagree_with_the_separators_are_refused(tmp_path, tokens, starts):
    # A shifted start used to load silently.
    path = tmp_path / "s.npz"
    TokenStore().save(path)
    _corrupt(path, header={"starts": starts}, tokens=np.array(tokens, dtype=np.int32))
    with pytest.raises(StoreFileError, match="corrupt"):
        TokenStore.load(path)


def test_version_1_files_are_refused_naming_the_versions(tmp_path):
    path = tmp_path / "s.npz"
    TokenStore().save(path)
    _corrupt(path, header={"version": 1})
    with pytest.raises(StoreFileError, match="format version 1; this lookahead reads version 2"):
        TokenStore.load(path)


def _hostile(path, *, max_tokens, declared, compression):
    """A store file whose tokens array declares `declared` int32 tokens but holds 1 MB of zeros."""
    header = json.dumps(dict(format="lookahead.TokenStore", version=2, max_tokens=max_tokens, min_ngram=1, max_ngram=8, starts=[]))
    npy = io.BytesIO()
    np.lib.format.write_array_header_1_0(npy, dict(descr="<i4", fortran_order=False, shape=(declared,)))
    with zipfile.ZipFile(path, "w") as archive:
        buffer = io.BytesIO()
        np.save(buffer, np.frombuffer(header.encode(), dtype=np.uint8))
        archive.writestr("header.npy", buffer.getvalue())
        archive.writestr("tokens.npy", npy.getvalue() + bytes(2**20), compress_type=compression)


@pytest.mark.parametrize(
    "max_tokens, declared, compression, message",
    [
        (10**12, 400_000_000, zipfile.ZIP_DEFLATED, "400000000 tokens, more than TokenIndex holds"),
        (1_000, 100_000_000, zipfile.ZIP_STORED, "100000000 tokens, more than max_tokens=1000"),
        (2**27, 100_000_000, zipfile.ZIP_DEFLATED, "compressed"),
        (2**27, 100_000_000, zipfile.ZIP_STORED, "declares 400000000 bytes of data, holds 1048576"),
    ],
    ids=["over_the_index_limit", "over_max_tokens", "deflated", "size_mismatch"],
)
def test_declared_array_sizes_are_checked_before_the_data_is_read(tmp_path, max_tokens, declared, compression, message):
    # A 1.5 MB deflated file declaring 400M tokens took 23 s and 5 GB before it was refused.
    path = tmp_path / "s.npz"
    _hostile(path, max_tokens=max_tokens, declared=declared, compression=compression)
    tracemalloc.start()
    try:
        with pytest.raises(StoreFileError, match=message):
            TokenStore.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20  # bytes: nothing sized by the declared shape was allocated


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


def _contents(store):
    """What a saved file must reproduce: the options and the sequences."""
    return (store.max_tokens, store.min_ngram, store.max_ngram, [s.tolist() for s in store.sequences()])


def test_save_while_other_threads_add_writes_loadable_consistent_files(tmp_path):
    # The header once held the live starts list and was written after the lock was released:
    # starts added meanwhile had no tokens in the file, which then did not load.
    store = TokenStore(max_tokens=20_000)
    stop = threading.Event()

    def writer(seed):
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            first = int(rng.integers(0, 10_000))
            store.add(np.arange(first, first + rng.integers(1, 60)))  # every sequence counts up by one

    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads interleave often, so saves really race with adds
    errors, join = start_threads(lambda: writer(0), lambda: writer(1))
    try:
        for i in range(20):
            seen = store.num_sequences
            while store.num_sequences == seen and not errors:  # a writer is busy: saves race with adds
                time.sleep(0.001)
            store.save(tmp_path / f"{i}.npz")
    finally:
        stop.set()
        join()
        sys.setswitchinterval(switch_interval)
    assert not errors
    for i in range(20):
        loaded = TokenStore.load(tmp_path / f"{i}.npz")
        assert 0 < len(loaded) <= 20_000
        for sequence in loaded.sequences():
            assert sequence.size and (np.diff(sequence) == 1).all()  # a whole sequence, as added


def _save_after_signal(store, path, started):
    started.set()
    store.save(path)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks the saving process, to kill it")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # the child only writes a file
def test_a_save_killed_midway_leaves_the_old_or_the_new_file_whole(tmp_path):
    # save() once truncated the target first: a crash mid-save left a file that did not load.
    old, new = TokenStore(max_tokens=16), TokenStore(max_tokens=2_000_000, min_ngram=1, max_ngram=1)
    old.add([1, 2, 3])
    new.add(np.arange(1_500_000) % 50_000)  # 6 MB on disk
    target = tmp_path / "store.npz"
    began = time.perf_counter()
    new.save(target)
    save_seconds = time.perf_counter() - began
    forks = multiprocessing.get_context("fork")  # no re-import: the child starts saving at once
    outcomes = []
    for fraction in (0.05, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5):
        old.save(target)
        started = forks.Event()
        child = forks.Process(target=_save_after_signal, args=(new, target, started))
        child.start()
        assert started.wait(10)
        time.sleep(fraction * save_seconds)
        child.kill()  # SIGKILL: no cleanup runs
        child.join()
        loaded = _contents(TokenStore.load(target))
        assert loaded in (_contents(old), _contents(new))
        outcomes.append(loaded == _contents(new))
    assert not outcomes[0]  # the earliest kill came before the save was done


def test_a_failed_save_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    old, new = TokenStore(), TokenStore()
    old.add([1, 2, 3])
    new.add([4, 5, 6, 7])
    old.save(tmp_path / "s.npz")

    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)  # the disk fails once the data is written
    with pytest.raises(OSError, match="Input/output"):
        new.save(tmp_path / "s.npz")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["s.npz"]
    assert _contents(TokenStore.load(tmp_path / "s.npz")) == _contents(old)


def _members(data: bytes) -> dict:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _zipped(members: dict) -> bytes:
    """An .npz of raw members, with their CRCs right: the loader's own checks must catch what is wrong."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


def _mutate(draw, original: bytes) -> tuple[bytes, bool]:
    """(a mutated file, whether it was rebuilt with right CRCs: then it may hold other data than was saved)."""
    kind = draw(st.sampled_from(["flip", "truncate", "header_field", "npy_header", "member_bytes"]))
    if kind == "flip":
        damaged = bytearray(original)
        for at, mask in draw(st.lists(st.tuples(st.integers(0, len(original) - 1), st.integers(1, 255)), min_size=1, max_size=4)):
            damaged[at] ^= mask
        return bytes(damaged), False
    if kind == "truncate":
        return original[: draw(st.integers(0, len(original) - 1))], False
    members = _members(original)
    if kind == "header_field":
        header = json.loads(np.load(io.BytesIO(members["header.npy"])).tobytes())
        field = draw(st.sampled_from(["format", "version", "max_tokens", "min_ngram", "max_ngram", "starts", "other"]))
        if draw(st.booleans()):
            header.pop(field, None)
        else:
            header[field] = draw(_JSON | st.lists(st.integers(-2, 40), max_size=8))
        if draw(st.integers(0, 9)) == 0:
            header = draw(_JSON)  # not even a dict
        members["header.npy"] = _npy(np.frombuffer(json.dumps(header).encode(), dtype=np.uint8))
    elif kind == "npy_header":
        name = draw(st.sampled_from(["header.npy", "tokens.npy"]))
        content = io.BytesIO(members[name])
        np.lib.format.read_magic(content)
        np.lib.format.read_array_header_1_0(content)
        declared = dict(
            descr=draw(st.sampled_from(["<i4", ">i4", "<u4", "<i8", "<i2", "|u1", "<f8", "|O", "<U2", "|b1", "<c8"])),
            fortran_order=draw(st.booleans()),
            shape=tuple(draw(st.lists(st.integers(-1, 2**62) | st.integers(0, 40), max_size=2))),
        )
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(head, declared)
        members[name] = head.getvalue() + content.read()
    else:  # member_bytes: anything in one member, its npy header included
        name = draw(st.sampled_from(["header.npy", "tokens.npy"]))
        content = bytearray(members[name])
        for at, mask in draw(st.lists(st.tuples(st.integers(0, len(content) - 1), st.integers(1, 255)), min_size=1, max_size=3)):
            content[at] ^= mask
        members[name] = bytes(content)
    return _zipped(members), True


def _as_declared(data: bytes):
    """What a file says, read by numpy: only called on files that loaded, whose sizes are sane."""
    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        header = json.loads(arrays["header"].tobytes())
        tokens = arrays["tokens"].astype(np.int64).tolist()
    sequences, start = [], 0
    for at, token in enumerate(tokens):
        if token == SEPARATOR:
            sequences.append(tokens[start:at])
            start = at + 1
    return (header["max_tokens"], header["min_ngram"], header["max_ngram"], sequences)


def test_mutated_files_load_what_they_hold_or_raise_store_file_error(tmp_path):
    store = TokenStore(max_tokens=64, min_ngram=1, max_ngram=4)
    for sequence in ([5, 6, 7, 8], [9], [6, 7, 10, 11, 12], [300, 2**31 - 2]):
        store.add(sequence)
    store.save(tmp_path / "saved.npz")
    original, saved = (tmp_path / "saved.npz").read_bytes(), _contents(store)
    path = tmp_path / "mutated.npz"

    @settings(max_examples=100, deadline=2000, database=None)
    @given(st.data())
    def check(data):
        mutated, rebuilt = _mutate(data.draw, original)
        path.write_bytes(mutated)
        tracemalloc.start()
        try:
            loaded = _contents(TokenStore.load(path))
        except StoreFileError:
            return
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert peak < 8 * 2**20  # bytes, for a file of a few hundred: nothing sized by what it declares
        assert loaded == (_as_declared(mutated) if rebuilt else saved)

    check()
