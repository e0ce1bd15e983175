"""Cost-aware draft sizing: how many drafted tokens are worth verifying (numpy only).

A cost curve `costs[n]` is the time of a verify step over n tokens relative to one
(`cost_curve`). `StepCosts` learns it from the loop's own step times, seeded by a
calibration (lookahead.integrations.calibration). `DraftSizer` keeps, per anchor match length, a
running estimate of the chance that a drafted token is kept, and cuts each chain draft to
the length n that maximises expected tokens per unit of time:

    E(n) = sum_{k=0..n} a^k = (1 - a^(n+1)) / (1 - a)        (a: per-token keep chance)
    n*   = argmax_n E(n) / cost(n + 1)                        (n = 0: a plain step)

so where drafts keep failing, and wide blocks are dear, it stops drafting. A tree draft
gets as many nodes as cost no more to verify than that chain (`tree_nodes`).
"""

import numpy as np

SIZES = (1, 2, 4, 8, 16, 32, 64)  # block sizes at which a cost curve is given


def cost_curve(points) -> np.ndarray:
    """costs[n] for n in 0..64 from the costs at SIZES (relative to one token), linear in between (costs[0] unused).

    Raises:
        ValueError: not len(SIZES) finite positive numbers starting at 1.
    """
    points = np.asarray(points, dtype=np.float64)
    if points.shape != (len(SIZES),) or not np.isfinite(points).all() or points[0] != 1.0 or (points <= 0).any():
        raise ValueError(f"a cost curve is {len(SIZES)} finite positive costs at block sizes {SIZES} starting at 1, got {points.tolist()}")
    return np.interp(np.arange(SIZES[-1] + 1), SIZES, points)


def plan_step(drafter, sizer, num_draft_tokens: int, *, tree: bool = False, max_tree_nodes: int = 64):
    """What a verification loop drafts for one step: (chain, draft to verify, chain size).

    The chain is the drafter's best guess of at most `num_draft_tokens` tokens; the sizer cuts it to
    `size` tokens, and a tree step verifies instead the tree with the nodes that cost about
    as much. Afterwards call `sizer.observed(chain.match_len, chain.token_ids.tolist(),
    size, written, position)` with the tokens the model wrote. Without a sizer (None)
    nothing is cut, and a tree step drafts only the tree (the chain is empty).
    """
    if sizer is None and tree:
        draft = drafter.propose_tree(num_draft_tokens, max_tree_nodes=max_tree_nodes)
        return draft.prefix(0), draft, 0
    chain = drafter.propose(num_draft_tokens)
    size = len(chain) if sizer is None or not len(chain) else sizer.size(chain.match_len, len(chain))
    if not tree or not size:
        return chain, chain.prefix(size), size
    return chain, drafter.propose_tree(num_draft_tokens, max_tree_nodes=sizer.tree_nodes(size, max_tree_nodes)), size


class StepCosts:
    """What verifying n tokens costs relative to one, learnt from the loop's own steps.

    Seeded with calibrated seconds per block width at SIZES. Each step the loop reports
    (width, seconds); the nearest SIZES entry (in log scale) keeps an exponential average.
    A width not yet seen is estimated from the nearest seen narrower one plus the
    calibration's extra seconds between the two: a wider block adds compute, which the
    context length barely changes, while a plain step's time grows with the context (so a
    calibration at a short context overprices wide blocks relative to one token).
    No monotone smoothing: a wider block measured cheaper stays cheaper, and one within
    NOISE of a narrower block's cost is priced as that narrower block, so the sizer
    verifies the wider one.

    Args:
        seconds: calibrated seconds of a forward pass over SIZES[i] new tokens.
        decay: weight of the old average when a step is observed.
    """

    NOISE = 0.05  # relative step-time differences smaller than this are noise (run-to-run spread)

    def __init__(self, seconds, *, decay: float = 0.8):
        self.seed = np.asarray(seconds, dtype=np.float64)  # (len(SIZES),) calibrated seconds
        if self.seed.shape != (len(SIZES),) or not (self.seed > 0).all():
            raise ValueError(f"seconds must be {len(SIZES)} positive times, got {self.seed.tolist()}")
        self.seconds = self.seed.copy()  # (len(SIZES),) learnt seconds where seen
        self.seen = np.zeros(len(SIZES), dtype=bool)
        self.decay = decay

    def observe(self, width: int, seconds: float) -> None:
        i = min(int(round(np.log2(max(width, 1)))), len(SIZES) - 1)
        self.seconds[i] = seconds if not self.seen[i] else self.decay * self.seconds[i] + (1 - self.decay) * seconds
        self.seen[i] = True

    def relative(self) -> np.ndarray:
        """costs[n], n in 0..64, relative to a plain step (cost_curve)."""
        estimate = self.seconds.copy()
        seen = np.flatnonzero(self.seen)
        for i in np.flatnonzero(~self.seen):
            below, above = seen[seen < i], seen[seen > i]
            anchor = below[-1] if below.size else above[0] if above.size else None
            if anchor is not None:  # the anchor's measured time plus the calibrated extra of the wider block
                estimate[i] = max(self.seconds[anchor] + self.seed[i] - self.seed[anchor], 1e-9)
        level = estimate[0]
        for i in range(1, len(SIZES)):
            if estimate[i] <= level * (1 + self.NOISE):
                estimate[i] = min(estimate[i], level)  # within noise of a narrower block: no dearer
            else:
                level = estimate[i]
        return cost_curve(estimate / estimate[0])


class DraftSizer:
    """Per-request choice of how many drafted tokens to verify.

    The per-token keep chance is estimated per anchor match length from counts of kept
    tokens and failures (a failure: the first drafted token the model did not write),
    with old counts fading. A match length seen rarely leans on the rate over all of them
    (PRIOR_WEIGHT pseudo-counts of it), so a request's first steps, each anchored on a
    longer match than the last, learn from one another. Verified tokens count at once;
    the unverified rest of a cut draft counts token by token as the model writes it, so
    drafts keep teaching the estimate while few or none of their tokens are verified.

    Args:
        costs: a cost curve (cost_curve; verify_costs(model)), or a StepCosts that the loop
            teaches with each step's time (`timed`; then `costs` follows it).
        max_ngram: the drafter's longest anchor.
        fade: factor applied to old counts at each update.
    """

    PRIOR_WEIGHT = 2.0  # pseudo-counts of the overall rate in each match length's estimate

    def __init__(self, costs, max_ngram: int, *, fade: float = 0.9):
        self.step_costs = costs if isinstance(costs, StepCosts) else None
        self.costs = costs.relative() if self.step_costs is not None else costs  # (65,) relative verify costs
        self.kept = np.zeros(max_ngram + 1)  # per anchor length: faded count of kept tokens
        self.failed = np.zeros(max_ngram + 1)  # and of failures
        self.overall = np.ones(2)  # faded (kept, failed) over all lengths, prior 1 each: 0.5 at first
        self.fade = fade
        self._watched: list[list] = []  # [match_len, unverified draft ids, position, how many counted]

    def keep_chance(self, match_len: int) -> float:
        m = min(match_len, self.kept.shape[0] - 1)
        prior = self.overall[0] / self.overall.sum()
        return float((self.kept[m] + self.PRIOR_WEIGHT * prior) / (self.kept[m] + self.failed[m] + self.PRIOR_WEIGHT))

    def size(self, match_len: int, available: int) -> int:
        """How many of `available` drafted tokens (anchored on match_len) to verify."""
        a = min(self.keep_chance(match_len), 0.999)
        n = np.arange(min(available, self.costs.shape[0] - 2) + 1)
        expected = (1 - a ** (n + 1)) / (1 - a)
        return int(np.argmax(expected / self.costs[n + 1]))

    def timed(self, width: int, seconds: float) -> None:
        """Learns from a verify step over `width` tokens that took `seconds` (with a StepCosts only)."""
        if self.step_costs is not None:
            self.step_costs.observe(width, seconds)
            self.costs = self.step_costs.relative()

    def update(self, match_len: int, kept: int, failed: bool) -> None:
        if not kept and not failed:
            return  # nothing learnt: old counts keep their weight
        m = min(match_len, self.kept.shape[0] - 1)
        self.kept[m] = self.fade * self.kept[m] + kept
        self.failed[m] = self.fade * self.failed[m] + failed
        self.overall = self.fade * self.overall + (kept, failed)

    def tree_nodes(self, chain_size: int, max_tree_nodes: int) -> int:
        """Nodes of a tree worth verifying where a chain would verify `chain_size` tokens.

        As many as cost no more than that chain: the heaviest nodes beyond the chain's are
        the likeliest other continuations. Where wide blocks are nearly free (GPUs) that is
        dozens of nodes; where the chain ends inside a flat stretch of the cost curve, the
        rest of the stretch; where every token costs, the chain's own size. Trees allowed
        10% more cost than the chain did 2-5% worse in the modelled replay of the dev
        traces under the bf16 curve, 30% more far worse.
        """
        if chain_size == 0:
            return 0
        limit = self.costs[chain_size + 1]
        nodes = min(max_tree_nodes, self.costs.shape[0] - 2)
        while nodes > chain_size and self.costs[nodes + 1] > limit:
            nodes -= 1
        return nodes

    def observed(self, match_len: int, draft_ids: list[int], verified: int, written: list[int], position: int) -> None:
        """Learns from a step whose chain draft `draft_ids` (drafted at sequence[position:]) had
        its first `verified` tokens checked, after which the model wrote `written`.

        Tokens the model wrote show whether the chain agreed even where the step verified
        a tree; the chain's rest past the verified tokens is watched (see settle).
        """
        checked = min(verified, len(written), len(draft_ids))
        agree = 0
        while agree < checked and draft_ids[agree] == written[agree]:
            agree += 1
        self.update(match_len, agree, agree < checked)
        if agree == checked and agree < len(draft_ids):
            self._watched.append([match_len, draft_ids[agree:], position + agree, 0])

    def settle(self, sequence: list[int]) -> None:
        """Counts the tokens of each watched rest that the sequence now shows kept, and its
        failure once written; a rest is dropped when it fails or is wholly written."""
        still = []
        for watched in self._watched:
            match_len, ids, position, counted = watched
            agree = counted
            while agree < len(ids) and position + agree < len(sequence) and sequence[position + agree] == ids[agree]:
                agree += 1
            failed = agree < len(ids) and position + agree < len(sequence)
            self.update(match_len, agree - counted, failed)
            watched[3] = agree
            if not failed and agree < len(ids):
                still.append(watched)
        self._watched = still


# -- batched steps (a serving engine: many rows verified in one forward pass) ----------------
#
# A step verifying T tokens (one per row plus the drafted ones) costs F + p*T; only the
# ratio h = F / p ("fixed_cost_tokens": how many verified tokens cost as much as the step's
# fixed part) matters. Adding a drafted token kept with chance g to a step expecting G tokens
# raises its tokens per second iff (G + g) / (F + p(T + 1)) > G / (F + pT), i.e.
#     g > G / (h + T).
# Idle hardware (h >> T) verifies nearly every drafted token; as rows fill the step, the bar
# rises toward the yield per verified token, G / T, and drafts shrink, then stop.


def batch_draft_sizes(keep_chances, lengths, *, fixed_cost_tokens: float) -> list[int]:
    """How many drafted tokens of each row a batched step verifies, for the most tokens per second.

    Row i's j-th drafted token (j = 1..lengths[i]) is kept with chance keep_chances[i] ** j.
    Tokens are taken likeliest first while each clears the bar g > G / (fixed_cost_tokens + T),
    G the step's expected tokens and T the tokens it verifies so far (each row's own one
    included), which maximises G / (F + p*T). Within a row the chances fall with j, so each
    row verifies a prefix of its draft.

    Args:
        keep_chances: per row, the chance a drafted token is kept (DraftSizer.keep_chance).
        lengths: per row, the drafted tokens available (0: none).
        fixed_cost_tokens: the step's fixed cost in verified tokens, F / p (> 0).
    Returns:
        per row, the number of its drafted tokens to verify.

    Example:
        >>> batch_draft_sizes([0.9, 0.2], [4, 4], fixed_cost_tokens=1000.0)  # idle hardware: all but the unlikeliest
        [4, 3]
        >>> batch_draft_sizes([0.9, 0.2], [4, 4], fixed_cost_tokens=1.0)  # every token costs: only the likely ones
        [2, 0]
    """
    chances, lengths = _rows(keep_chances, lengths, fixed_cost_tokens)
    sizes = [0] * chances.shape[0]
    rows = np.repeat(np.arange(chances.shape[0]), lengths)  # (sum(lengths),): the row of each drafted token
    depth = np.arange(rows.shape[0]) - np.repeat(np.cumsum(lengths) - lengths, lengths) + 1  # its place in its row, from 1
    gains = chances[rows] ** depth
    expected = float(chances.shape[0])  # G: each row's own token
    verified = float(chances.shape[0])  # T
    for t in np.lexsort((depth, rows, -gains)).tolist():  # likeliest first; a row's tokens in order
        gain = float(gains[t])
        if gain <= expected / (fixed_cost_tokens + verified):
            break
        sizes[int(rows[t])] += 1
        expected += gain
        verified += 1
    return sizes


def _rows(keep_chances, lengths, fixed_cost_tokens: float) -> tuple[np.ndarray, np.ndarray]:
    """(keep chances capped at 0.999, lengths) as arrays, checked: 1-D, one per row, fixed_cost_tokens > 0."""
    chances = np.minimum(np.asarray(keep_chances, dtype=np.float64), 0.999)
    lengths = np.asarray(lengths, dtype=np.int64)
    if chances.shape != lengths.shape or chances.ndim != 1:
        raise ValueError(f"keep_chances and lengths must be 1-D and of one length, got shapes {chances.shape} and {lengths.shape}")
    if not fixed_cost_tokens > 0:
        raise ValueError(f"fixed_cost_tokens must be > 0, got {fixed_cost_tokens!r}")
    return chances, lengths


FIXED_COST_BOUNDS = (1.0, 4096.0)  # fixed_cost_tokens is kept within these


def fixed_cost_tokens_of(fixed: float, per_token: float, bounds=FIXED_COST_BOUNDS) -> float:
    """F / p of a step time F + p * tokens, clamped to `bounds`; p <= 0 (extra tokens cost
    nothing measurable) gives the upper bound."""
    if per_token <= 0:
        return float(bounds[1])
    return float(np.clip(fixed / per_token, *bounds))


class StepCostFit:
    """Learns fixed_cost_tokens (F / p) from a loop's measured steps: wall time = F + p * tokens.

    A least-squares fit with old samples fading, pulled toward `prior` (F = prior * p) by a
    penalty worth `prior_weight` samples one token apart: steps all of one size, or none,
    leave it at the prior; a spread of sizes moves it to what they show. The estimate is
    clamped to `bounds` (fixed_cost_tokens_of).

    Example:
        >>> fit = StepCostFit(prior=64.0)
        >>> for tokens in (4, 8, 12, 16, 20) * 20:
        ...     fit.add(tokens, 0.010 + 0.001 * tokens)  # F = 10 ms, p = 1 ms: F / p = 10
        >>> round(fit.fixed_cost_tokens, 1)
        10.0
    """

    def __init__(self, prior: float, *, prior_weight: float = 4.0, fade: float = 0.99, bounds=FIXED_COST_BOUNDS):
        if not bounds[0] <= prior <= bounds[1]:
            raise ValueError(f"prior must lie in {bounds}, got {prior!r}")
        self.prior = float(prior)
        self.prior_weight = prior_weight
        self.fade = fade
        self.bounds = bounds
        self.samples = 0
        self._normal = np.zeros((2, 2))  # faded sum of x x^T, x = (1, tokens)
        self._moment = np.zeros(2)  # faded sum of x * seconds

    def add(self, tokens: int, seconds: float) -> None:
        x = np.array([1.0, float(tokens)])
        self._normal = self.fade * self._normal + np.outer(x, x)
        self._moment = self.fade * self._moment + x * seconds
        self.samples += 1

    @property
    def fixed_cost_tokens(self) -> float:
        if not self.samples:
            return self.prior
        prior = np.array([1.0, -self.prior]) / np.hypot(1.0, self.prior)  # penalty prior_weight * (F - prior * p)^2 / (1 + prior^2)
        fixed, per_token = np.linalg.solve(self._normal + self.prior_weight * np.outer(prior, prior), self._moment)
        return fixed_cost_tokens_of(fixed, per_token, self.bounds)


# -- static batches (our engine: rows right-padded to one block width, until the last row ends) --
#
# Our engine verifies B rows as one (B, W) block: each row's own token and draft, right-padded
# to the widest. A step costs F + p*B*W whatever the rows hold, and the batch runs until its
# last row ends, each row leaving the block as it ends. With h = F / p, the batch's
# remaining time is about h * (its steps) + (the places its rows take in them). A step
# shortens the second by every token a row gains, but the first only by what the rows
# furthest behind all gain: row r, with R_r tokens still to write at its rate so far of
# e_r tokens per step, has about N_r = R_r / e_r steps left; the rows within one step of
# the largest N are behind, and the batch's steps fall by the least of their gains, whose
# expectation is M(W) = sum_{j=1..W-1} prod_{r behind} a_r^j (a row whose draft is shorter
# than j: 0). The width W then maximises the step's worth per unit of its cost,
#     (h * (1 + M(W)) + sum_r G_r(W)) / (h + B * W),
# G_r(W) = 1 + a_r + ... + a_r^min(n_r, W-1) the row's expected tokens (a_r its keep
# chance, n_r its draft); a plain step scores 1. For one row this is tokens per unit of
# time, (h + 1) G(W) / (h + W); rows alike and level draft only where all are likely to
# keep (a continuously refilled batch, batch_draft_sizes, values every row's tokens alike).


def static_batch_draft_sizes(keep_chances, lengths, remaining, rates, *, fixed_cost_tokens: float) -> list[int]:
    """How many drafted tokens of each row a step of a static padded batch verifies, to finish the batch soonest.

    The step's width W (1 + the most drafted tokens of a row) maximises the step's worth per
    unit of its cost (above); every row then verifies min(lengths[r], W - 1) tokens (the
    padding would cost as much). Ties go to the narrower block.

    Args:
        keep_chances: per row, the chance a drafted token is kept (DraftSizer.keep_chance).
        lengths: per row, the drafted tokens available (0: none).
        remaining: per row, the most tokens it may still write (>= 1).
        rates: per row, its tokens per step so far (>= 1).
        fixed_cost_tokens: the step's fixed cost in verified tokens, F / p (> 0).
    Returns:
        per row, the number of its drafted tokens to verify.

    Example:
        >>> static_batch_draft_sizes([0.9] * 2, [8] * 2, [64] * 2, [1] * 2, fixed_cost_tokens=1000.0)  # idle hardware
        [8, 8]
        >>> static_batch_draft_sizes([0.6] * 2, [4] * 2, [64] * 2, [1] * 2, fixed_cost_tokens=4.0)  # a CPU, 2 rows
        [1, 1]
        >>> static_batch_draft_sizes([0.6] * 16, [4] * 16, [64] * 16, [1] * 16, fixed_cost_tokens=4.0)  # 16 rows: a column costs 16
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        >>> static_batch_draft_sizes([0.9, 0.2], [8, 8], [60, 60], [1, 1], fixed_cost_tokens=8.0)  # rows level: both must keep
        [1, 1]
        >>> static_batch_draft_sizes([0.9, 0.2], [8, 8], [60, 60], [2.0, 1.0], fixed_cost_tokens=8.0)  # the row behind keeps little
        [1, 1]
        >>> static_batch_draft_sizes([0.2, 0.9], [8, 8], [60, 60], [2.0, 1.0], fixed_cost_tokens=8.0)  # the row behind keeps much
        [6, 6]
    """
    chances, lengths = _rows(keep_chances, lengths, fixed_cost_tokens)
    remaining, rates = np.asarray(remaining, dtype=np.float64), np.asarray(rates, dtype=np.float64)
    if remaining.shape != chances.shape or rates.shape != chances.shape:
        raise ValueError(f"remaining and rates need one entry per row ({chances.shape[0]}), got shapes "
                         f"{remaining.shape} and {rates.shape}")
    steps = remaining / rates  # N_r: steps each row has left at its rate so far
    rows = chances.shape[0]
    if rows == 0 or lengths.max(initial=0) == 0:
        return [0] * rows
    behind = steps >= steps.max() - 1  # the rows that would end on the batch's last step
    drafted = np.arange(int(lengths.max()) + 1)  # W - 1 for each candidate width
    depth = np.minimum(drafted[:, None], lengths[None, :])  # (widths, rows): tokens of row r verified
    expected = (1 - chances ** (depth + 1)) / (1 - chances)  # G_r(W) = 1 + a + ... + a^depth
    # P(every row behind keeps j tokens), j = 1..: prod_r a_r^j, 0 where a row's draft is shorter
    j = drafted[1:, None]
    all_keep = np.prod(np.where(j <= lengths[behind], chances[behind] ** j, 0.0), axis=1)
    least = np.concatenate([[0.0], np.cumsum(all_keep)])  # M(W)
    worth = fixed_cost_tokens * (1 + least) + expected.sum(axis=1)
    best = int(np.argmax(worth / (fixed_cost_tokens + rows * (drafted + 1))))
    return np.minimum(lengths, best).tolist()
