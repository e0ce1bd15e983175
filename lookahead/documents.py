"""`DocumentLibrary`: many reference documents; each request consults only those it shares text with.

A RAG pipeline or code-assistant backend may hold thousands of documents (retrieved
passages, repository files). Indexing all of them for every request costs memory and time
and lets unrelated text anchor drafts. The library keeps an Aho-Corasick automaton
(pyahocorasick) over sampled n-grams of every document; at the start of a request one pass
over the prompt finds the documents that share an n-gram with it, and only those are
indexed for the request.
"""

import ahocorasick
import numpy as np

from lookahead.index import DEFAULT_MAX_NGRAM, DEFAULT_MIN_NGRAM, as_token_ids
from lookahead.store import TokenStore

DEFAULT_KEY_NGRAM = 12  # documents are found through shared 12-token runs
DEFAULT_STRIDE = 4  # a key at every 4th position: any shared run of 12 + 4 - 1 = 15 tokens is found
DEFAULT_MAX_DOCUMENTS = 8  # a request consults at most this many, those sharing the most runs


def _as_text(ids: np.ndarray) -> str:
    # One character per token id, skipping the surrogate block that str keys cannot hold.
    return "".join(chr(t if t < 0xD800 else t + 0x800) for t in ids.tolist())


class DocumentLibrary:
    """Reference documents, and the per-request selection of the relevant ones.

    Args:
        key_ngram: length of the token runs that link a prompt to a document.
        stride: a run is registered every `stride` positions of a document, so shared
            text of key_ngram + stride - 1 tokens is always found (memory: one automaton
            key per `stride` document tokens).
        max_documents: a request consults at most this many documents: those sharing the
            most key runs with its prompt.
        select_above_tokens: below this many document tokens in all, every request just
            uses every document (indexing them once is cheaper than selecting).

    Example:
        >>> library = DocumentLibrary(key_ngram=2, stride=1)
        >>> library.add([10, 11, 12, 13])
        >>> library.add([20, 21, 22])
        >>> library.select([5, 21, 22])
        [1]
    """

    def __init__(
        self,
        *,
        key_ngram: int = DEFAULT_KEY_NGRAM,
        stride: int = DEFAULT_STRIDE,
        max_documents: int = DEFAULT_MAX_DOCUMENTS,
        select_above_tokens: int = 32_768,
    ):
        if key_ngram < 1 or stride < 1 or max_documents < 1:
            raise ValueError(f"key_ngram, stride and max_documents must be >= 1, got {key_ngram}, {stride}, {max_documents}")
        self.max_documents = max_documents
        self.key_ngram = key_ngram
        self.stride = stride
        self.select_above_tokens = select_above_tokens
        self.documents: list[np.ndarray] = []  # token ids of each document, int64
        self._keys: dict[str, list[int]] = {}  # key text -> indices of documents holding it
        self._automaton = ahocorasick.Automaton()
        self._automaton_stale = False
        self._everything: TokenStore | None = None  # all documents, built lazily for small libraries
        self.num_tokens = 0

    def __len__(self) -> int:
        return len(self.documents)

    def add(self, token_ids) -> None:
        """Adds one document (1-D token ids)."""
        ids = as_token_ids(token_ids, name="document token ids")
        if ids.size == 0:
            return
        doc = len(self.documents)
        self.documents.append(ids)
        self.num_tokens += ids.size
        text = _as_text(ids)
        for start in range(0, max(1, len(text) - self.key_ngram + 1), self.stride):
            key = text[start : start + self.key_ngram]
            holders = self._keys.setdefault(key, [])
            if not holders:
                self._automaton.add_word(key, key)
            if holders[-1:] != [doc]:
                holders.append(doc)
        self._automaton_stale = True
        self._everything = None

    def select(self, prompt_ids) -> list[int]:
        """The documents sharing the most key runs with `prompt_ids` (at most max_documents), most first.

        Cost: one automaton pass over the prompt, O(len(prompt) + matches).
        """
        if not self.documents:
            return []
        if self._automaton_stale:
            self._automaton.make_automaton()
            self._automaton_stale = False
        hits: dict[int, int] = {}
        for _, key in self._automaton.iter(_as_text(as_token_ids(prompt_ids, name="prompt ids"))):
            for doc in self._keys[key]:
                hits[doc] = hits.get(doc, 0) + 1
        return sorted(hits, key=lambda doc: (-hits[doc], doc))[: self.max_documents]

    def selection(self, prompt_ids) -> tuple[int, ...]:
        """The documents a request with this prompt consults, as a key: all of a small library
        (select_above_tokens or fewer tokens), else `select`'s; () for none."""
        if self.num_tokens <= self.select_above_tokens:
            return tuple(range(len(self.documents)))
        return tuple(self.select(prompt_ids))

    def store_for(self, prompt_ids, *, min_ngram: int = DEFAULT_MIN_NGRAM, max_ngram: int = DEFAULT_MAX_NGRAM) -> TokenStore | None:
        """A TokenStore of the documents relevant to a request (all of them in a small library); None if none."""
        if not self.documents:
            return None
        if self.num_tokens <= self.select_above_tokens:
            if self._everything is None:
                self._everything = self.store_of(range(len(self.documents)), min_ngram=min_ngram, max_ngram=max_ngram)
            return self._everything
        chosen = self.select(prompt_ids)
        return self.store_of(chosen, min_ngram=min_ngram, max_ngram=max_ngram) if chosen else None

    def store_of(self, docs, *, min_ngram: int = DEFAULT_MIN_NGRAM, max_ngram: int = DEFAULT_MAX_NGRAM) -> TokenStore:
        """A new TokenStore of these documents (indices, in this order). Cost: O(their tokens)."""
        total = sum(self.documents[d].size + 1 for d in docs)
        store = TokenStore(max_tokens=max(16, total), min_ngram=min_ngram, max_ngram=max_ngram)
        for d in docs:
            store.add(self.documents[d])
        return store

    def save(self, path) -> None:
        """Writes the documents (in TokenStore's file format, atomically; the automaton is rebuilt on load)."""
        self.store_of(range(len(self.documents)), min_ngram=1, max_ngram=1).write_file(path, kind="DocumentLibrary")

    @classmethod
    def load(cls, path, **kwargs) -> "DocumentLibrary":
        """Reads a library written by `save`; StoreFileError if the file is not one (nothing is built), OSError if unreadable."""
        library = cls(**kwargs)
        for document in TokenStore.read_file(path, kind="DocumentLibrary").sequences():
            library.add(document)
        return library
