"""The drafting policy that LookupDrafter and the engine's rows (engine.kernels.advance's chains, engine.trees' trees)
share: how much each kind of candidate weighs, how many occurrences a draft walks, how a tree is cut."""

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
TREE_DEPTH_DECAY = 0.9  # a tree node counts 10% less per level: the model may leave every candidate
# The model's own predictions (PredictionTable): a path of the table's best-first expansion from the
# last token weighs PREDICTION_SCALE * its probability (RankChances) * w / c, where lookup's heaviest
# first token weighs w and is the model's next token with chance c (LeadChances, per match length):
# both sources on one scale of probability, so the table leads where lookup's candidates are short,
# disagree or are absent (weight 1 then), and a long match that keeps holding leads with its chain.
PREDICTION_SCALE = 2.0  # chosen over 0.5 and 1 on stories260K's unsized trees (notes/README.md: predictions scale)
# Best-first paths of the table a draft takes. A plain chain (propose without hedged) takes none:
# it has no room for the table's siblings, so its tokens per step are lookup's alone
# (notes/README.md: blended chains).
PREDICTION_CHAIN_NODES = 0
PREDICTION_TREE_NODES = 64  # and a tree's
