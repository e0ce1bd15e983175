"""The drafting policy that LookupDrafter and the engine's batched chains (engine.kernels.advance) share:
how much each kind of lookup candidate weighs, and how many occurrences a draft walks."""

# The drafting policy: how much each kind of candidate weighs (see LookupDrafter._fill_trie).
# A candidate anchored on match_len tokens weighs scale * MATCH_BASE ** match_len.
MATCH_BASE = 2.0  # per matched token: a longer match outweighs two shorter ones
STORE_SCALE = 0.5  # a store's match counts as one token shorter than the request's own
SUBSTITUTION_SCALE = 0.25  # a substitution counts as two tokens shorter
SKIP_SCALE = 1.0  # the model skipped a source token: counts as a match of the tokens before it
# Occurrences examined per draft, (of the suffix, of the suffix without its last token): a chain needs the
# few best; a tree's extra branches come from the rest.
CHAIN_WALK = (8, 4)
TREE_WALK = (64, 16)
FIRST_REACH = 64  # occurrences searched for a prompt-only match's first occurrence: O(FIRST_REACH * max_ngram) a draft
