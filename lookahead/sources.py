"""Where a token came from: a drafted token's source (its trie node's origin, trie.py), or MODEL for
the one token each verify step writes itself. Codes index SOURCES; int8 in arrays."""

MODEL, PROMPT, OUTPUT, DOCUMENTS, MEMORY, PREDICTIONS, OTHER = range(7)
SOURCES = ("model", "prompt", "output", "documents", "memory", "predictions", "other")  # other: a draft made without a source
