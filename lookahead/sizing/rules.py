"""How many drafted tokens a step verifies, given keep chances (engine.kernels.keep_chance) and a cost (sizing.cost).

One rule (docs/design.md, section 4): the most expected tokens per unit of step cost. One row: a chain's
first n tokens (`chain_size`), a tree's likeliest nodes (`tree_size`); a batch's tree (`tree_nodes`); a static
batch, which runs until its last row ends (`static_batch_draft_sizes`); a served batch (`batch_draft_sizes`).
"""

import numpy as np
from numba import njit

MAX_CHANCE = 0.999  # keep chances are capped below 1: E(n) stays finite


# A chain kept with at least this chance is worth verifying wide wherever a wide block is priced right: its
# expected tokens grow nearly with its width, which costs a fraction of a plain step per token on any hardware
# measured. So a wider width the sizer has not measured lately is tried (chain_size's probe), never left to a
# price the prior or a burst of load set.
SURE = 0.9


def chain_size(keep_chance: float, available: int, cost) -> int:
    """How many of `available` drafted tokens a one-row step verifies: argmax_n E(n) / cost(1, n + 1)
    (the first of equals), drafting only where that beats a plain step's worth by MIN_GAIN. A kernel:
    it runs every step, over up to 65 widths.

    The probe: a chain kept with chance >= SURE whose best size leaves tokens unverified verifies
    2n + 1 of them instead where that width's price is not measured (`cost.measured`): one step
    doubles the widest width tried, and what it costs is then known."""
    a = min(keep_chance, MAX_CHANCE)
    n = best_chain(a, available, cost.one_row(available + 1), MIN_GAIN)
    if a >= SURE and n < available:
        probe = min(available, 2 * n + 1)
        if not cost.measured(probe + 1):
            return probe
    return n


# A draft is verified (or, served, sent: sizing.load) only where it promises this much more tokens per second
# than a step without it: smaller gains are within what step times tell apart, and a width measured level with
# a plain step by chance would otherwise draft for ever what is never kept.
MIN_GAIN = 0.05


@njit(cache=True)
def best_chain(a, available, costs, margin):  # pragma: no cover (compiled)
    best, best_worth = 0, (1 + margin) / costs[1]
    for n in range(1, available + 1):
        worth = (1 - a ** float(n + 1)) / (1 - a) / costs[n + 1]
        if worth > best_worth:
            best, best_worth = n, worth
    return best


# A sized tree takes the widest of the sizes whose worth is within this share of the best: where verifying is nearly
# free the worth is flat over dozens of nodes and the thin nodes' chances read low (docs/design.md, section 5); where
# tokens cost, the worth falls fast past the best, so it adds a node or so, at most this share of the expected speed.
TREE_WORTH_TOLERANCE = 0.02


def tree_size(chances, cost) -> int:
    """How many nodes of a tree a one-row step verifies: of N whose worth (1 + sum(chances[:N])) / cost(1, N + 1) is
    within TREE_WORTH_TOLERANCE of the best, the largest; `chances` each node's chance that the model writes its path,
    likeliest first (DraftTrie.likeliest): the chain rule (chain_size) for a tree, whose N likeliest nodes are the
    tree of most expected tokens at N. Where verifying is nearly free (a GPU at one row) that is every node the
    model may write; where every token costs, the few it likely does. A kernel, as chain_size."""
    chances = np.asarray(chances, dtype=np.float64)
    return best_tree(chances, cost.one_row(chances.shape[0] + 1), TREE_WORTH_TOLERANCE)


@njit(cache=True)
def best_tree(chances, costs, tolerance):  # pragma: no cover (compiled)
    n = chances.shape[0]
    worth = np.empty(n + 1)
    worth[0], expected = 1.0 / costs[1], 1.0
    for i in range(1, n + 1):
        expected += chances[i - 1]
        worth[i] = expected / costs[i + 1]
    bar = worth.max() * (1.0 - tolerance)
    for i in range(n, -1, -1):
        if worth[i] >= bar:
            return i
    return 0


def tree_gain(chances, keep_chance: float, chain_tokens: int, cost) -> float:
    """What a one-row tree of nodes with these `chances` (tree_size's pick) promises over `chain_tokens` tokens of its
    chain (chain_size's, each kept with `keep_chance` given those before): expected tokens per step price under
    `cost`, the tree's over the chain's. Above 1 the tree, priced as a chain of its width, writes more a second;
    a tree step that costs more than that chain (LoopCosts) pays while its extra cost stays below this."""
    costs = cost.one_row(max(len(chances), chain_tokens) + 1)
    a = min(keep_chance, MAX_CHANCE)
    chain = (1 - a ** (chain_tokens + 1)) / (1 - a) / costs[chain_tokens + 1]
    return float((1.0 + np.sum(chances)) / costs[len(chances) + 1] / chain)


def tree_nodes(chain_size: int, max_tree_nodes: int, cost, *, rows: int = 1) -> int:
    """Nodes of a tree worth verifying where a chain would verify `chain_size` tokens.

    As many as cost no more than that chain: the heaviest nodes beyond the chain's are the likeliest other
    continuations. Where wide blocks are nearly free (GPUs) that is dozens of nodes; where
    the chain ends inside a flat stretch of the cost curve, the rest of the stretch; where
    every token costs, the chain's own size.
    """
    if chain_size == 0:
        return 0
    if max_tree_nodes <= chain_size:
        return max_tree_nodes
    costs = cost.cost(rows, np.arange(chain_size + 1, max_tree_nodes + 2))  # blocks of chain_size.. nodes, the own token included
    return chain_size + int(np.flatnonzero(costs <= costs[0])[-1])


# -- batched steps (a serving engine: many rows verified in one forward pass) ----------------
#
# A step verifying T tokens (one per row plus the drafted ones) costs F + p*T; only the
# ratio h = F / p ("fixed_cost_tokens": how many verified tokens cost as much as the step's
# fixed part) matters. Adding a drafted token kept with chance g to a step expecting G tokens
# raises its tokens per second iff (G + g) / (F + p(T + 1)) > G / (F + pT), i.e.
#     g > G / (h + T).
# Idle hardware (h >> T) verifies nearly every drafted token; as rows fill the step, the bar
# rises toward the yield per verified token, G / T, and drafts shrink, then stop.


def batch_draft_sizes(chances, *, cost) -> list[int]:
    """How many drafted tokens of each row a batched step verifies, for the most tokens per second.

    Row i's j-th drafted token is kept with chance chances[i][j] (not rising with j; capped at
    MAX_CHANCE; an empty list: no draft). Tokens are taken likeliest first while each clears the
    bar g > G / (fixed_cost_tokens + T), G the step's expected tokens and T the tokens it verifies
    so far (each row's own one included), which maximises G / (F + p*T). Within a row the chances
    fall with j, so each row verifies a prefix of its draft.

    Args:
        chances: per row, its drafted tokens' chances of being kept (engine.kernels.token_chances).
        cost: the step's cost (sizing.cost); only its fixed part in verified tokens, F / p, is read.
    Returns:
        per row, the number of its drafted tokens to verify.

    Example:
        >>> from lookahead.sizing.cost import LineCost
        >>> sure, unsure = [0.9, 0.81, 0.73, 0.66], [0.2, 0.04, 0.01, 0.002]
        >>> batch_draft_sizes([sure, unsure], cost=LineCost(1000.0))  # idle hardware: all but the unlikeliest
        [4, 3]
        >>> batch_draft_sizes([sure, unsure], cost=LineCost(1.0))  # every token costs: only the likely ones
        [2, 0]
    """
    rows = [np.asarray(row, dtype=np.float64) for row in chances]
    if any(row.ndim != 1 or (row < 0).any() or (np.diff(row) > 0).any() for row in rows):
        raise ValueError("each row's chances must be a 1-D sequence of numbers >= 0, not rising")
    lengths = np.array([row.shape[0] for row in rows], dtype=np.int64)
    per_token = np.zeros((len(rows), max(int(lengths.max(initial=0)), 1)), dtype=np.float64)  # (row, longest)
    for i, row in enumerate(rows):
        per_token[i, : lengths[i]] = row
    sizes = np.zeros(lengths.shape[0], dtype=np.int64)
    batch_sizes(per_token, lengths, lengths.shape[0], float(cost.fixed_cost_tokens), sizes)
    return sizes.tolist()


@njit(cache=True)
def batch_sizes(chances, lengths, rows, fixed_cost_tokens, sizes, trust=1.0):
    """batch_draft_sizes over arrays, for callers that run it every step (the vLLM proposer): writes
    sizes[r] for a step of `rows` rows (each verifying its own token; rows without a chain,
    lengths[r] == 0, need not be passed); returns (drafted tokens taken, of them expected kept).

    Row r's j-th drafted token is kept with chance trust * min(chances[r, j], MAX_CHANCE) (trust: the
    share of such promises kept, at most 1; chances: (row, >= lengths[r]), not rising with j); tokens
    are taken likeliest first (ties: lower row) while each clears G / (fixed_cost_tokens + T), G the
    step's expected tokens and T the tokens it verifies so far. Within a row the chances fall with j,
    so the likeliest token left is some row's next one: each take scans the rows with tokens left.
    Cost: O(R + taken x R') for R rows, R' of them with a chain; no sort.
    """
    n = chances.shape[0]
    live = np.empty(n, dtype=np.int64)  # (live,) rows with tokens left to take, a nonzero chance
    gain = np.empty(n, dtype=np.float64)  # (live,) its next token's chance
    m = 0
    for r in range(n):
        sizes[r] = 0
        if lengths[r] > 0 and chances[r, 0] > 0.0:
            live[m], gain[m] = r, min(chances[r, 0], MAX_CHANCE)
            m += 1
    expected = float(rows)  # G: each row's own token
    verified = float(rows)  # T
    taken = 0
    while m > 0:
        best = 0
        for i in range(1, m):
            if gain[i] > gain[best] or (gain[i] == gain[best] and live[i] < live[best]):
                best = i
        g = gain[best]
        if trust * g <= expected / (fixed_cost_tokens + verified):
            break
        r = live[best]
        sizes[r] += 1
        expected += trust * g
        verified += 1.0
        taken += 1
        if sizes[r] == lengths[r]:  # the row's chain is all taken: the last live row takes its place
            m -= 1
            live[best], gain[best] = live[m], gain[m]
        else:
            gain[best] = min(chances[r, sizes[r]], MAX_CHANCE)
    return taken, expected - rows


# -- static batches (our loop: rows right-padded to one block width, until the last row ends) --
#
# A (B, W) step costs F + p*B*W, and the batch ends with its last row: a token a row gains saves its
# place, the step's fixed part only if every row furthest behind gains it too (docs/design.md, "Batches:
# a static batch", derives the worth below; for one row it is chain_size's choice).


def static_batch_draft_sizes(keep_chances, lengths, remaining, rates, *, cost) -> list[int]:
    """How many drafted tokens of each row a step of a static padded batch verifies, to finish the batch soonest.

    The step's width W (1 + the most drafted tokens of a row) maximises the step's worth per
    unit of its cost (above); every row then verifies min(lengths[r], W - 1) tokens (the
    padding would cost as much). Ties go to the narrower block.

    Args:
        keep_chances: per row, the chance a drafted token is kept (engine.kernels.keep_chance).
        lengths: per row, the drafted tokens available (0: none).
        remaining: per row, the most tokens it may still write (>= 1).
        rates: per row, its tokens per step so far (>= 1).
        cost: the step's cost (sizing.cost): `cost(rows, width)` and its fixed part h = F / p.
    Returns:
        per row, the number of its drafted tokens to verify.

    Example:
        >>> from lookahead.sizing.cost import LineCost
        >>> static_batch_draft_sizes([0.9] * 2, [8] * 2, [64] * 2, [1] * 2, cost=LineCost(1000.0))  # idle hardware
        [8, 8]
        >>> static_batch_draft_sizes([0.6] * 2, [4] * 2, [64] * 2, [1] * 2, cost=LineCost(4.0))  # a CPU, 2 rows
        [1, 1]
        >>> static_batch_draft_sizes([0.6] * 16, [4] * 16, [64] * 16, [1] * 16, cost=LineCost(4.0))  # 16 rows: a column costs 16
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        >>> static_batch_draft_sizes([0.9, 0.2], [8, 8], [60, 60], [1, 1], cost=LineCost(8.0))  # rows level: both must keep
        [1, 1]
        >>> static_batch_draft_sizes([0.9, 0.2], [8, 8], [60, 60], [2.0, 1.0], cost=LineCost(8.0))  # the row behind keeps little
        [1, 1]
        >>> static_batch_draft_sizes([0.2, 0.9], [8, 8], [60, 60], [2.0, 1.0], cost=LineCost(8.0))  # the row behind keeps much
        [6, 6]
    """
    if len(keep_chances) == len(lengths) == len(remaining) == len(rates) == 1:
        # M(W) = G(W) - 1: the worth is (h + 1) G(W), chain_size's choice (no fit of h read)
        return [chain_size(float(keep_chances[0]), int(lengths[0]), cost) if lengths[0] else 0]
    chances, lengths = np.asarray(keep_chances, dtype=np.float64), np.asarray(lengths, dtype=np.int64)
    remaining, rates = np.asarray(remaining, dtype=np.float64), np.asarray(rates, dtype=np.float64)
    if chances.shape != lengths.shape or chances.ndim != 1:
        raise ValueError(f"keep_chances and lengths must be 1-D and of one length, got shapes {chances.shape} and {lengths.shape}")
    if remaining.shape != chances.shape or rates.shape != chances.shape:
        raise ValueError(f"remaining and rates need one entry per row ({chances.shape[0]}), got shapes "
                         f"{remaining.shape} and {rates.shape}")
    rows = chances.shape[0]
    longest = int(lengths.max(initial=0))
    sizes = np.zeros(rows, dtype=np.int64)
    if longest:  # (one kernel call past the prices: it runs every batch step)
        _static_sizes(chances, lengths, remaining / rates, cost.fixed_cost_tokens, cost.cost(rows, np.arange(1, longest + 2)), sizes)
    return sizes.tolist()


@njit(cache=True)
def _static_sizes(chances, lengths, steps, fixed_cost_tokens, prices, out):
    """out[r] = min(lengths[r], d*) for the d* that maximises worth(d) / prices[d] (the first of equals): the worth of
    _static_worths at keep chances capped at MAX_CHANCE, prices[d] the step's cost at width d + 1."""
    capped = np.minimum(chances, MAX_CHANCE)
    worth = np.empty(prices.shape[0])
    _static_worths(capped, lengths, steps, fixed_cost_tokens, worth)
    best = 0
    for d in range(1, worth.shape[0]):
        if worth[d] / prices[d] > worth[best] / prices[best]:
            best = d
    for r in range(out.shape[0]):
        out[r] = min(lengths[r], best)


@njit(cache=True)
def _static_worths(chances, lengths, steps, fixed_cost_tokens, out):
    """out[d]: the worth of a static batch's step whose rows verify min(lengths[r], d) drafted tokens: h (1 + M) + sum_r G_r,
    G_r = 1 + a_r + ... + a_r^depth its expected tokens, M = sum_j P(every row furthest behind keeps j tokens), the rows
    furthest behind those with steps[r] (steps left at its rate) within 1 of the most. O(rows * len(out)) products."""
    behind = steps.max() - 1
    rows = chances.shape[0]
    power = np.ones(rows)  # a_r^d
    expected = np.zeros(rows)  # G_r at depth min(d, lengths[r])
    least = 0.0  # M: sum over j <= d of prod over the rows behind of a_r^j (0 where a row's draft is shorter than j)
    for d in range(out.shape[0]):
        total = 0.0
        all_keep = 1.0 if d > 0 else 0.0
        for r in range(rows):
            if d <= lengths[r]:
                expected[r] += power[r]
            elif steps[r] >= behind:
                all_keep = 0.0
            total += expected[r]
            if d > 0 and steps[r] >= behind:
                all_keep *= power[r]
            power[r] *= chances[r]
        least += all_keep
        out[d] = fixed_cost_tokens * (1.0 + least) + total
