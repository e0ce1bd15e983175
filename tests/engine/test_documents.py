"""engine.documents.DocumentStores, through LookupProposer over a fake runner: a request drafts from the documents
its prompt selects, in a store released with its last request.
"""

import numpy as np

from tests.fake_runner import FakeRunner, new_proposer


def large_library(tmp_path, documents=400, length=100, seed=0):
    """A DocumentLibrary file above select_above_tokens (each request then consults the documents its prompt
    shares runs with): `documents` random documents of `length` tokens, and the documents themselves."""
    from lookahead import DocumentLibrary

    rng = np.random.default_rng(seed)
    docs = [rng.integers(100, 5000, size=length).tolist() for _ in range(documents)]
    library = DocumentLibrary()
    for doc in docs:
        library.add(doc)
    assert library.num_tokens > library.select_above_tokens
    library.save(tmp_path / "documents.npz")
    return str(tmp_path / "documents.npz"), docs


def test_requests_draft_from_the_documents_their_prompt_selects(tmp_path):
    path, docs = large_library(tmp_path)
    proposer = new_proposer(documents_path=path, memory=False)
    runner = FakeRunner(proposer)
    rows = [(f"q{i}", [1, 2] + docs[i][10:30], [docs[i][30]]) for i in (3, 250)]
    assert runner.step(proposer, rows, [[docs[3][30]], [docs[250][30]]]) == [docs[3][31:35], docs[250][31:35]]
    assert proposer.batch.document_stores.live == 2  # one store each: they select different documents
    runner.step(proposer, [("q9", [7], [8])], [[8]])  # both finished: their stores went with them
    assert proposer.batch.document_stores.live == 0
