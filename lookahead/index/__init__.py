"""The token index: numba kernels (`kernels`) and the class over them (`TokenIndex`);
the draft trie that merges candidate continuations (`trie.DraftTrie`)."""

from lookahead.index.token_index import TokenIndex

__all__ = ["TokenIndex"]
