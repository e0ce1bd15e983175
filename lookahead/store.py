"""`TokenStore`: token sequences shared between requests: past outputs, reference documents.

Drafters consult a store when their own context has nothing as good: what earlier
requests wrote (cross-request memory) and documents a RAG pipeline or code assistant
retrieved. One store may serve many drafters in many threads.
"""

import contextlib
import errno
import json
import os
import threading
import uuid
import zipfile
from pathlib import Path

import numpy as np

from lookahead.errors import StoreFileError
from lookahead.index import DEFAULT_MAX_NGRAM, DEFAULT_MIN_NGRAM, SEPARATOR, TokenIndex, as_token_ids, kernels

DEFAULT_MAX_TOKENS = 262_144  # about 15 MB (about 60 bytes a token, see TokenIndex)
FILE_KINDS = ("TokenStore", "DocumentLibrary")  # header["format"] is f"lookahead.{kind}": the class whose load reads the file
_FORMATS = tuple(f"lookahead.{kind}" for kind in FILE_KINDS)
_VERSION = 2  # 2: a format marker per class (1: TokenStore's, for DocumentLibrary files too)


class _Reading:
    """TokenStore.reading's context: the store's lock held, its index's buffers as a plain tuple.
    A class, not a generator's context manager: a per-step caller (the vLLM proposer) pays two
    method calls for it."""

    __slots__ = ("_store",)

    def __init__(self, store: "TokenStore"):
        self._store = store

    def __enter__(self) -> tuple:
        self._store._lock.acquire()
        return self._store._index._arrays()

    def __exit__(self, *exc) -> None:
        self._store._lock.release()


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
    def min_ngram(self) -> int:
        return self._index.min_ngram

    @property
    def max_ngram(self) -> int:
        return self._index.max_ngram

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

    def reading(self) -> "_Reading":
        """The store's index as kernels read it, with the store's lock held until the block ends.

        Yields the plain tuple lookahead.index.kernels and lookahead.trie take (tokens, prev, table,
        n, min_ngram, max_ngram; TokenIndex.buffers): no `add` changes it inside the block. Do not
        write its arrays; after the block they hold until the next add or eviction replaces them.
        For per-step callers that run their own kernels over the store (the vLLM proposer).

        Example:
            >>> store = TokenStore()
            >>> store.add([10, 11, 12])
            >>> with store.reading() as index:
            ...     index[kernels.INDEX_N]  # tokens indexed, the separator included
            4
        """
        return _Reading(self)

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
        """Writes the store to `path` (numpy .npz: a versioned header and the tokens).

        Atomic: the file is written beside `path` and renamed over it, so a crash leaves the old
        file or the new one, whole (a crash may leave a hidden `.<name>.<random>.tmp` behind).
        """
        self.write_file(path, kind="TokenStore")

    def write_file(self, path: str | Path, *, kind: str) -> None:
        """`save`, marking the file as one of `kind` (in FILE_KINDS): the class whose load reads it.

        For classes kept in a store's file format (DocumentLibrary.save); `read_file` refuses a file
        of another kind, so no class loads another's file.
        """
        _check_kind(kind)
        with self._lock:  # copies: adds after the lock is released must not reach the file
            header = dict(format=f"lookahead.{kind}", version=_VERSION, max_tokens=self.max_tokens,
                          min_ngram=self._index.min_ngram, max_ngram=self._index.max_ngram, starts=list(self._starts))
            tokens = self._index.tokens.astype(np.int32)
        _write_atomically(Path(path), header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), tokens=tokens)

    @classmethod
    def load(cls, path: str | Path) -> "TokenStore":
        """Reads a store written by `save`.

        Time and memory are linear in the file's size, whatever its arrays declare.

        Raises:
            StoreFileError: the file is not a TokenStore file (corrupt, truncated, foreign, of
                another format version, over its max_tokens); nothing is built.
            OSError: the file cannot be read (FileNotFoundError, PermissionError, ...).
        """
        return cls.read_file(path, kind="TokenStore")

    @classmethod
    def read_file(cls, path: str | Path, *, kind: str) -> "TokenStore":
        """`load` of a file that `write_file` marked as one of `kind`; StoreFileError for a file of another kind."""
        _check_kind(kind)
        with open(path, "rb") as f:  # an unreadable file raises its own OSError: it is not a corrupt one
            try:
                store, tokens, starts = cls._read(f, kind)
            except StoreFileError as e:
                raise StoreFileError(f"{path}: {e}") from None
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: a seek before the file's start, where a corrupt zip points
                    raise
                raise StoreFileError(f"{path}: not a lookahead store file ({e})") from None
            except Exception as e:  # zip, npy and json errors all mean: not a readable store
                raise StoreFileError(f"{path}: not a lookahead store file ({type(e).__name__}: {e})") from None
        store._refill(tokens)
        return store

    @classmethod
    def _read(cls, f, kind: str) -> tuple["TokenStore", np.ndarray, list[int]]:
        # (an empty store with the file's options, its tokens, its sequence starts), all validated
        file_bytes = os.fstat(f.fileno()).st_size
        with zipfile.ZipFile(f) as archive:
            header = json.loads(_read_array(archive, "header", file_bytes).tobytes())
            written_by = header.get("format") if isinstance(header, dict) else None
            if written_by not in _FORMATS:
                raise StoreFileError(f"not a lookahead store file (format {written_by!r})")
            if header.get("version") != _VERSION:
                raise StoreFileError(f"lookahead file format version {header.get('version')!r}; this lookahead reads version {_VERSION} only")
            if written_by != f"lookahead.{kind}":
                other = written_by.removeprefix("lookahead.")
                raise StoreFileError(f"a {other} file, not a {kind} one: read it with {other}.load")
            options = {name: header.get(name) for name in ("max_tokens", "min_ngram", "max_ngram")}
            if any(type(value) is not int for value in options.values()):
                raise StoreFileError(f"max_tokens, min_ngram and max_ngram must be ints, got {options}")
            try:
                store = cls(**options)
            except ValueError as e:
                raise StoreFileError(f"bad options: {e}") from None
            limits = [(store.max_tokens, f"max_tokens={store.max_tokens}"), (kernels.MAX_POSITIONS, f"TokenIndex holds ({kernels.MAX_POSITIONS})")]
            tokens = _read_array(archive, "tokens", file_bytes, limits)
        tokens, starts = _stored_sequences(tokens, header.get("starts"))
        return store, tokens, starts


def _check_kind(kind: str) -> None:
    if kind not in FILE_KINDS:
        raise ValueError(f"kind must be one of {FILE_KINDS}, got {kind!r}")


def _read_array(archive: zipfile.ZipFile, name: str, file_bytes: int, limits=()) -> np.ndarray:
    """The 1-D integer array `name`.npy of an .npz, its shape, dtype and size checked before its data is read.

    limits: (most items, what sets it) pairs. Only uncompressed members are read, as `save` writes them, so
    that no declared size can outgrow the file (`file_bytes` long).
    """
    info = archive.getinfo(f"{name}.npy")
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read_header is None:
            raise StoreFileError(f"{name}: npy format version {version}, expected 1.0 or 2.0")
        shape, _, dtype = read_header(member)
        if len(shape) != 1 or dtype.kind not in "iu":
            raise StoreFileError(f"{name}: a 1-D integer array expected, got shape {shape}, dtype {dtype}")
        for most, what in limits:
            if shape[0] > most:
                raise StoreFileError(f"{name}: {shape[0]} {name}, more than {what}")
        if info.compress_type != zipfile.ZIP_STORED:
            raise StoreFileError(f"{name}: compressed; lookahead reads the uncompressed arrays that save writes")
        nbytes = shape[0] * dtype.itemsize
        held = info.file_size - member.tell()
        if held != nbytes or info.compress_size != info.file_size or info.file_size > file_bytes:
            raise StoreFileError(f"{name}: declares {nbytes} bytes of data, holds {held}")
        data = member.read(nbytes)  # to the member's end, so zipfile checks its CRC
    if len(data) != nbytes:
        raise StoreFileError(f"{name}: truncated")
    return np.frombuffer(data, dtype=dtype)


def _stored_sequences(tokens: np.ndarray, starts) -> tuple[np.ndarray, list[int]]:
    """Validates a saved store's tokens (sequences, each nonempty and ended by SEPARATOR) and the
    starts saved with them; returns (the tokens as int64, the starts)."""
    try:
        as_token_ids(tokens[tokens != SEPARATOR])
    except ValueError as e:
        raise StoreFileError(f"tokens: {e}") from None
    after = np.flatnonzero(tokens == SEPARATOR) + 1  # one past each separator: where the next sequence starts
    expected = [0] + after[:-1].tolist() if after.size else []
    ended = (int(after[-1]) if after.size else 0) == tokens.size
    if starts != expected or not ended or (np.diff(after, prepend=0) < 2).any():
        raise StoreFileError("corrupt lookahead store (tokens and sequence starts disagree)")
    return tokens.astype(np.int64), expected


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
