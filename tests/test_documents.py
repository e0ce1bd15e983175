"""DocumentLibrary: which documents a request consults, and drafting from them."""

import numpy as np
import pytest

from lookahead import DocumentLibrary, LookupDrafter, StoreFileError


def library_of(docs, **kwargs):
    library = DocumentLibrary(**kwargs)
    for doc in docs:
        library.add(doc)
    return library


def test_select_finds_the_documents_sharing_runs_most_first():
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 1000, 200) for _ in range(50)]
    library = library_of(docs, key_ngram=8, stride=4, max_documents=3)
    prompt = np.concatenate([docs[7][20:60], docs[31][100:115], [5, 6]])
    assert library.select(prompt) == [7, 31]  # 40 shared tokens beat 15
    assert library.select(rng.integers(1000, 2000, 50)) == []


def test_selection_drafts_like_indexing_everything_when_the_document_is_found():
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 500, 300) for _ in range(40)]
    prompt = np.concatenate([[1, 2, 3], docs[12][50:80]])
    drafts = []
    for select_above in (0, 10**9):  # selected vs everything
        drafter = LookupDrafter(memory=False, documents=library_of(docs, select_above_tokens=select_above))
        drafter.reset(prompt)
        drafts.append(drafter.propose().token_ids.tolist())
    assert drafts[0] == drafts[1] == docs[12][80 : 80 + len(drafts[0])].tolist()
    assert len(drafts[0]) == drafter.num_draft_tokens  # the document runs on past the draft


def test_small_libraries_use_every_document_without_selecting():
    library = library_of([[1, 2, 3, 4], [7, 8, 9]], key_ngram=8)
    store = library.store_for([8])
    assert store is not None and store.num_sequences == 2


def test_a_document_added_mid_request_is_seen_at_once():
    drafter = LookupDrafter(memory=False)
    drafter.reset([4, 5, 6])
    assert len(drafter.propose()) == 0
    drafter.add_document([9, 5, 6, 10, 11])
    assert drafter.propose().token_ids.tolist() == [10, 11]


def test_save_and_load_round_trip(tmp_path):
    rng = np.random.default_rng(2)
    docs = [rng.integers(0, 300, 100) for _ in range(5)]
    library = library_of(docs, key_ngram=6, stride=2, select_above_tokens=0)
    library.save(tmp_path / "docs.npz")
    loaded = DocumentLibrary.load(tmp_path / "docs.npz", key_ngram=6, stride=2, select_above_tokens=0)
    assert [d.tolist() for d in loaded.documents] == [d.tolist() for d in docs]
    prompt = docs[3][10:30]
    assert loaded.select(prompt) == library.select(prompt)


def test_load_refuses_a_foreign_file(tmp_path):
    path = tmp_path / "x.npz"
    path.write_bytes(b"not a store")
    with pytest.raises(StoreFileError, match="not a lookahead store file"):
        DocumentLibrary.load(path)


@pytest.mark.parametrize(
    "kwargs, message", [(dict(key_ngram=0), "key_ngram"), (dict(stride=0), "stride"), (dict(max_documents=0), "max_documents")]
)
def test_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DocumentLibrary(**kwargs)


def test_documents_must_be_a_library():
    with pytest.raises(TypeError, match="DocumentLibrary"):
        LookupDrafter(documents=[1, 2])


def test_each_class_refuses_the_others_file(tmp_path):
    # Both classes once wrote the same format marker, so each loaded the other's files.
    from lookahead import TokenStore

    store = TokenStore()
    store.add([1, 2, 3])
    store.save(tmp_path / "store.npz")
    library_of([[4, 5, 6]]).save(tmp_path / "library.npz")
    with pytest.raises(StoreFileError, match=r"a TokenStore file, not a DocumentLibrary one: read it with TokenStore\.load"):
        DocumentLibrary.load(tmp_path / "store.npz")
    with pytest.raises(StoreFileError, match=r"a DocumentLibrary file, not a TokenStore one: read it with DocumentLibrary\.load"):
        TokenStore.load(tmp_path / "library.npz")
    assert [d.tolist() for d in DocumentLibrary.load(tmp_path / "library.npz").documents] == [[4, 5, 6]]
