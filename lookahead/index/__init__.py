"""The token index: numba kernels (`kernels`) and the class over them (`TokenIndex`)."""

from lookahead.index.token_index import TokenIndex

__all__ = ["TokenIndex"]
