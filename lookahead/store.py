"""`TokenStore`: token sequences shared between requests: past outputs, reference documents.

Drafters consult a store when their own context has nothing as good: what earlier
requests wrote (cross-request memory) and documents a RAG pipeline or code assistant
retrieved. One store may serve many drafters in many threads.
"""

import json
import threading
from pathlib import Path

import numpy as np

from lookahead.errors import StoreFileError
from lookahead.index import DEFAULT_MAX_NGRAM, DEFAULT_MIN_NGRAM, SEPARATOR, TokenIndex, as_token_ids

DEFAULT_MAX_TOKENS = 262_144  # about 15 MB (about 60 bytes a token, see TokenIndex)
_FORMAT = "lookahead.TokenStore"
_VERSION = 1


class TokenStore:
    """A bounded, thread-safe index over whole token sequences.

    Sequences are kept in arrival order; when more than `max_tokens` are held, the oldest
    are evicted (the index is rebuilt from the newer half: O(max_tokens) once per
    max_tokens / 2 added tokens). Every method takes the store's lock, so a query never
    sees a half-added sequence or a half-evicted index.

    Args:
        max_tokens: memory cap in tokens (about 60 bytes each, see TokenIndex).
        min_ngram, max_ngram: as in TokenIndex.

    Example:
        >>> store = TokenStore()
        >>> store.add([10, 11, 12, 13])
        >>> store.add([20, 21])
        >>> [ids.tolist() for ids in store.sequences()]
        [[10, 11, 12, 13], [20, 21]]
    """

    def __init__(self, *, max_tokens: int = DEFAULT_MAX_TOKENS, min_ngram: int = DEFAULT_MIN_NGRAM,
                 max_ngram: int = DEFAULT_MAX_NGRAM):
        if not isinstance(max_tokens, int) or max_tokens < 16:
            raise ValueError(f"max_tokens must be an int >= 16, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self._index = TokenIndex(min_ngram=min_ngram, max_ngram=max_ngram)
        self._starts: list[int] = []  # start position of each held sequence, ascending
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Tokens held, separators included."""
        return len(self._index)

    @property
    def num_sequences(self) -> int:
        return len(self._starts)

    @property
    def nbytes(self) -> int:
        return self._index.nbytes

    def add(self, token_ids) -> None:
        """Appends one sequence (1-D token ids in [0, MAX_TOKEN_ID])."""
        ids = as_token_ids(token_ids)
        if ids.size == 0:
            return
        ids = ids[-(self.max_tokens - 1) :]  # a sequence longer than the store keeps its end
        with self._lock:
            if len(self._index) + ids.size + 1 > self.max_tokens:
                self._evict(ids.size + 1)
            self._starts.append(len(self._index))
            self._index.extend(ids)
            self._index.end_sequence()

    def sequences(self) -> list[np.ndarray]:
        """The held sequences, oldest first (int64 copies, separators removed)."""
        with self._lock:
            tokens = self._index.tokens.astype(np.int64)
            starts = list(self._starts)
        ends = starts[1:] + [tokens.shape[0]]
        return [tokens[start : end - 1] for start, end in zip(starts, ends)]  # each sequence ends with its separator

    def add_continuation(self, trie, query: np.ndarray, num_draft_tokens: int, *, match_base: float, scale: float) -> int:
        """Adds to a DraftTrie what followed the most recent occurrence of the longest suffix of
        `query` (1-D int32 or int64 numpy ids), up to num_draft_tokens tokens and the end of
        its sequence, weighted scale * match_base**match_len; returns match_len (0: nothing added).

        One kernel call under the lock: the per-step path of a drafter.
        """
        with self._lock:
            return trie.add_longest_match(self._index.buffers(), query, num_draft_tokens, match_base=match_base, scale=scale,
                                          stop_token=SEPARATOR)

    def _evict(self, room: int) -> None:
        # Keep the newest sequences that fit in half the cap (and leave `room`).
        keep_from = len(self._starts)
        budget = min(self.max_tokens // 2, self.max_tokens - room)
        while keep_from > 0 and len(self._index) - self._starts[keep_from - 1] <= budget:
            keep_from -= 1
        kept = self._index.tokens[self._starts[keep_from] :] if keep_from < len(self._starts) else self._index.tokens[:0]
        self._refill(kept.astype(np.int64))

    def _refill(self, tokens: np.ndarray) -> None:
        """Replaces the contents by `tokens`: whole sequences, each ended by SEPARATOR."""
        ends = np.flatnonzero(tokens == SEPARATOR)
        self._index.clear()
        self._starts = []
        start = 0
        for end in ends.tolist():
            self._starts.append(len(self._index))
            self._index.extend(tokens[start:end])
            self._index.end_sequence()
            start = end + 1

    # -- persistence -----------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Writes the store to `path` (numpy .npz: a versioned header and the tokens)."""
        with self._lock:
            header = dict(format=_FORMAT, version=_VERSION, max_tokens=self.max_tokens,
                          min_ngram=self._index.min_ngram, max_ngram=self._index.max_ngram, starts=self._starts)
            tokens = self._index.tokens.astype(np.int32)
        with open(path, "wb") as f:
            np.savez(f, header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), tokens=tokens)

    @classmethod
    def load(cls, path: str | Path) -> "TokenStore":
        """Reads a store written by `save`. Raises StoreFileError, and builds nothing, if the file is not one."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                header = json.loads(bytes(data["header"]).decode())
                tokens = np.asarray(data["tokens"], dtype=np.int64)
        except FileNotFoundError:
            raise StoreFileError(f"{path}: no such file") from None
        except Exception as e:  # zip, npy and json errors all mean: not a readable store
            raise StoreFileError(f"{path}: not a lookahead store file ({type(e).__name__}: {e})") from None
        if not isinstance(header, dict) or header.get("format") != _FORMAT:
            raise StoreFileError(f"{path}: not a lookahead store file (format {header.get('format') if isinstance(header, dict) else None!r})")
        if header.get("version") != _VERSION:
            raise StoreFileError(f"{path}: store format version {header.get('version')!r}, this lookahead reads {_VERSION}")
        starts = header.get("starts")
        valid = (
            isinstance(starts, list)
            and tokens.ndim == 1
            and all(isinstance(s, int) for s in starts)
            and starts == sorted(starts)
            and (not starts or (starts[0] == 0 and tokens.size > 0 and tokens[-1] == SEPARATOR))
            and int(np.count_nonzero(tokens == SEPARATOR)) == len(starts)
            and (tokens.size == 0 or int(tokens.min()) >= 0)
        )
        if not valid:
            raise StoreFileError(f"{path}: corrupt lookahead store (tokens and sequence starts disagree)")
        store = cls(max_tokens=header["max_tokens"], min_ngram=header["min_ngram"], max_ngram=header["max_ngram"])
        store._refill(tokens)
        return store
