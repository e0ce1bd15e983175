"""`TokenStore`: token sequences shared between requests: past outputs, reference documents.

Drafters consult a store when their own context has nothing as good: what earlier
requests wrote (cross-request memory) and documents a RAG pipeline or code assistant
retrieved. One store may serve many drafters in many threads.
"""

import contextlib
import json
import os
import threading
import uuid
from pathlib import Path

import numpy as np

from lookahead.index import TokenIndex, kernels
from lookahead.index.token_index import _as_token_array

SEPARATOR = 2**31 - 1  # ends every sequence: no gram spans two sequences, none ends at the last position
_FORMAT = "lookahead.TokenStore"
_VERSION = 1
_NOTHING = np.zeros(0, dtype=np.int64)


def as_sequence(token_ids) -> np.ndarray:
    """Validates a stored sequence: 1-D token ids below SEPARATOR; int64 numpy."""
    ids = _as_token_array(token_ids)
    if ids.size and int(ids.max()) >= SEPARATOR:
        raise ValueError(f"token ids must be < {SEPARATOR} (reserved as the separator), got {int(ids.max())}")
    return ids


class StoreFileError(ValueError):
    """A saved store that cannot be loaded: corrupt, truncated, foreign or of another version."""


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
        >>> length, continuation = store.propose([5, 11, 12], max_tokens=4)
        >>> length, continuation.tolist()
        (2, [13])
    """

    def __init__(self, *, max_tokens: int = 1_000_000, min_ngram: int = 1, max_ngram: int = 8):
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
        """Appends one sequence (1-D token ids, each < 2**31 - 1)."""
        ids = as_sequence(token_ids)
        if ids.size == 0:
            return
        ids = ids[-(self.max_tokens - 1) :]  # a sequence longer than the store keeps its end
        with self._lock:
            if len(self._index) + ids.size + 1 > self.max_tokens:
                self._evict(ids.size + 1)
            self._starts.append(len(self._index))
            self._index.extend(ids)
            self._index.append(SEPARATOR)

    def propose(self, query: np.ndarray, max_tokens: int) -> tuple[int, np.ndarray]:
        """(match length, continuation) for the longest suffix of `query` found in the store.

        `query` holds token ids (only the last max_ngram matter). The continuation follows
        the match's most recent occurrence and stops at the end of its sequence; it is
        empty, with length 0, when nothing matched.
        """
        with self._lock:
            length, end = self._index.longest_match(query)
            if length == 0:
                return 0, _NOTHING
            tokens = self._index.continuation(end, max_tokens)
        stop = kernels.first_invalid(tokens, SEPARATOR)  # the first id >= SEPARATOR: the sequence's end
        return length, tokens[:stop] if stop >= 0 else tokens

    def add_continuation(self, trie, query: np.ndarray, depth: int, *, match_weight: float, scale: float) -> int:
        """Adds to a DraftTrie what `propose(query, depth)` would return, weighted
        scale * match_weight**m for an m-token match; returns m (0: nothing added).

        `query`: 1-D int32 or int64 numpy token ids. One kernel call under the lock: the
        per-step path of a drafter.
        """
        with self._lock:
            return trie.add_longest_match(self._index, query, depth, match_weight=match_weight, scale=scale, stop_token=SEPARATOR)

    def _evict(self, room: int) -> None:
        # Keep the newest sequences that fit in half the cap (and leave `room`).
        keep_from = len(self._starts)
        budget = min(self.max_tokens // 2, self.max_tokens - room)
        while keep_from > 0 and len(self._index) - self._starts[keep_from - 1] <= budget:
            keep_from -= 1
        if keep_from == len(self._starts):
            kept = np.zeros(0, dtype=np.int64)
        else:
            kept = self._index.tokens[self._starts[keep_from] :].astype(np.int64)
        shift = self._starts[keep_from] if keep_from < len(self._starts) else 0
        self._starts = [s - shift for s in self._starts[keep_from:]]
        self._index.clear()
        self._index.extend(kept)

    # -- persistence -----------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Writes the store to `path` (numpy .npz: a versioned header and the tokens).

        Atomic: the file is written beside `path` and renamed over it, so a crash leaves the old
        file or the new one, whole (a crash may leave a hidden `.<name>.<random>.tmp` behind).
        """
        with self._lock:  # copies: adds after the lock is released must not reach the file
            header = dict(format=_FORMAT, version=_VERSION, max_tokens=self.max_tokens,
                          min_ngram=self._index.min_ngram, max_ngram=self._index.max_ngram, starts=list(self._starts))
            tokens = self._index.tokens.astype(np.int32)
        _write_atomically(Path(path), header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), tokens=tokens)

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
        store._index.extend(tokens)
        store._starts = starts
        return store


def _write_atomically(path: Path, **arrays: np.ndarray) -> None:
    """Writes an .npz of `arrays` to a temporary file beside `path`, syncs it and renames it over `path`."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temporary, "xb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    with contextlib.suppress(OSError):  # make the rename durable too, where directories can be opened and synced
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
