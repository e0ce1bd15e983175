"""The token index: numba kernels (`kernels`) and the class over them (`TokenIndex`)."""

from lookahead.index.token_index import (
    DEFAULT_MAX_NGRAM, DEFAULT_MIN_NGRAM, MAX_TOKEN_ID, SEPARATOR, IndexBuffers, TokenIndex, as_id_set, as_token_ids,
)

__all__ = ["DEFAULT_MAX_NGRAM", "DEFAULT_MIN_NGRAM", "MAX_TOKEN_ID", "SEPARATOR", "IndexBuffers", "TokenIndex", "as_id_set", "as_token_ids"]
