"""What a verify step costs: `cost(rows, width)`, relative to a plain one-row step (1 at (1, 1)),
`fixed_cost_tokens` h = F / p of the step time F + p * tokens, and `one_row(last)`: the relative costs
of one-row blocks of 0..last tokens as a float64 array (what a one-row sizer's kernel reads every step).

- `CostCurve`: a fixed curve (`cost_curve`; `verify_costs`); `StepCosts`: learnt from a loop's one-row steps;
- `LineCost`: the line at a fixed h; `StepCostFit` learns h from steps;
- `LoopCosts`: what our loop prices with (the curve for one row, the line for many).
"""

import numpy as np
from numba import njit

SIZES = (1, 2, 4, 8, 16, 32, 64)  # block sizes at which a cost curve is given
FIXED_COST_BOUNDS = (1.0, 4096.0)  # fixed_cost_tokens is kept within these
UNPRICED = 1e6  # the relative cost of a block nothing has priced yet: no draft pays for it
NO_CAP = -1  # StepCosts._cap: no seen wider width
LEAST_BLOCK = 0.8  # no block costs less than this share of a plain step (the least measured: 0.92, bfloat16, 2 tokens)
ONCE_DEAREST = 2.0  # a width's one step prices it at most this many times its unseen price (a stall's share of it)
MEASURED = 2  # StepCosts: a width priced by this many of its steps is measured (chain_size probes no further)
PRICE_CHANGED, NEWLY_SEEN = 1, 2  # observe_width's news (0: no price that price_widths reads changed)


def cost_curve(points) -> np.ndarray:
    """costs[n] for n in 0..64 from the costs at SIZES (relative to one token), linear in between (costs[0] unused).

    Raises:
        ValueError: not len(SIZES) finite positive numbers starting at 1.
    """
    points = np.asarray(points, dtype=np.float64)
    if points.shape != (len(SIZES),) or not np.isfinite(points).all() or points[0] != 1.0 or (points <= 0).any():
        raise ValueError(f"a cost curve is {len(SIZES)} finite positive costs at block sizes {SIZES} starting at 1, got {points.tolist()}")
    return np.interp(np.arange(SIZES[-1] + 1), SIZES, points)


def fixed_cost_tokens_of(fixed: float, per_token: float, bounds=FIXED_COST_BOUNDS) -> float:
    """F / p of a step time F + p * tokens, clamped to `bounds`; p <= 0 (extra tokens cost
    nothing measurable) gives the upper bound."""
    if per_token <= 0:
        return float(bounds[1])
    return float(min(max(fixed / per_token, bounds[0]), bounds[1]))  # (np.clip on a scalar: ~5 µs, every engine step)


def line_through(seconds) -> float:
    """F / p of the least-squares line F + p * n through step times at SIZES tokens."""
    per_token, fixed = np.polyfit(np.asarray(SIZES, dtype=np.float64), np.asarray(seconds, dtype=np.float64), 1)
    return fixed_cost_tokens_of(fixed, per_token)


class CostCurve:
    """A fixed relative cost curve: costs[n] is a one-row block of n tokens relative to one.

    A (rows, width) block is priced as rows * width tokens; past the curve's end, linearly
    from its last segment.
    """

    def __init__(self, costs):
        self.costs = np.asarray(costs, dtype=np.float64)  # (>= 3,) relative costs, costs[1] == 1
        self._fixed = None

    def cost(self, rows: int, width):
        """Relative cost of a (rows, width) block; `width` an int or an int array."""
        n = rows * np.asarray(width)
        return self.one_row(int(n.max()))[n]

    def one_row(self, last: int) -> np.ndarray:
        """cost(1, n) for n in 0..last (index 0 unused)."""
        return extend_linearly(self.costs[: last + 1], last)

    def measured(self, width: int) -> bool:
        """Whether a one-row block of `width` tokens is priced by measurement (a fixed curve: always)."""
        return True

    @property
    def fixed_cost_tokens(self) -> float:
        if self._fixed is None:
            self._fixed = line_through(self.cost(1, np.asarray(SIZES)))
        return self._fixed


def extend_linearly(costs: np.ndarray, last: int) -> np.ndarray:
    """`costs` (>= 3 entries) continued to index `last` along its last segment, as CostCurve.cost prices past its end,
    never below LEAST_BLOCK plain steps (a falling last segment, measured widths' noise, would reach 0 and below)."""
    end = costs.shape[0] - 1
    if last <= end:
        return costs
    step = costs[end] - costs[end - 1]
    return np.concatenate([costs, np.maximum(costs[end] + (np.arange(end + 1, last + 1) - end) * step, LEAST_BLOCK * costs[1])])


class StepCosts(CostCurve):
    """A cost curve learnt from the loop's own one-row steps, width by width (docs/design.md, section 4).

    A width is priced by the least of its last WINDOW steps after its first (torch's one-time costs for
    the shape): load and stalls only add time. Until MEASURED steps, its one step prices it at most
    ONCE_DEAREST times its unseen price;
    one not stepped at for MAX_AGE one-row steps is forgotten. An unseen width is the nearest seen
    narrower one plus the extra seconds between the two (the least of the prior's and the seen widths'
    Theil-Sen line's), never dearer than a seen wider one. The prior: a calibration's seconds at SIZES,
    or the chord t(1) + s (w - 1), s the least over the prefills of (1 + head_ratio) (t(L) - t(1)) / (L - 1)
    (a prefill scores its last token only; a verified token also costs the output layer). A seen width
    within NOISE of a narrower drafted one is priced as it. Until a prefill and MEASURED plain steps are
    in, every drafted width is UNPRICED. Cost: `observe` is an array update; the next `one_row` prices
    the 65 widths in one compiled call (price_widths, about 2 µs hot), where a price it reads changed.

    Args:
        seconds: calibrated seconds of a forward pass over SIZES[i] new tokens, or None (learnt from the call).
        head_ratio: what scoring a token costs over the rest of its forward (0: the prefill scored every token).

    Example:
        >>> costs = StepCosts()
        >>> bool(costs.one_row(2)[2] == UNPRICED)  # nothing measured yet: no draft pays
        True
        >>> costs.observe_prefill(1, 101, 1.1)  # the prefill: 101 tokens in 1.1 s
        >>> costs.observe(1, 1, 0.3)  # the first plain step: torch's one-time costs, not learnt from
        >>> costs.observe(1, 1, 0.1); costs.observe(1, 1, 0.1)  # plain steps: 0.1 s; the chord adds 0.01 s per token
        >>> round(float(costs.one_row(11)[11]), 6)
        2.0
        >>> for seconds in (0.4, 0.19, 5.0, 0.2):  # 11 tokens, a stall among them
        ...     costs.observe(1, 11, seconds)
        >>> round(float(costs.one_row(11)[11]), 6)  # the least of their steps after the first
        1.9
    """

    NOISE = 0.05  # relative step-time differences smaller than this are noise (run-to-run spread)
    WINDOW = 4  # a width is priced by the least of its last WINDOW steps
    MAX_AGE = 32  # a width not stepped at for this many one-row steps is priced as unseen
    MEASURED = MEASURED
    LEAST_BLOCK = LEAST_BLOCK

    def __init__(self, seconds=None, *, head_ratio: float = 0.0):
        if not head_ratio >= 0:
            raise ValueError(f"head_ratio must be >= 0, got {head_ratio!r}")
        self.head_ratio = float(head_ratio)
        self.seed = None if seconds is None else np.asarray(seconds, dtype=np.float64)  # (len(SIZES),) calibrated seconds
        if self.seed is not None and (self.seed.shape != (len(SIZES),) or not (self.seed > 0).all()):
            raise ValueError(f"seconds must be {len(SIZES)} positive times, got {self.seed.tolist()}")
        widths = SIZES[-1] + 1
        # (65,) arrays, index 0 unused, priced by one kernel call (price_widths) after each observe.
        # calibrated: the prior's seconds per width; None until the chord is known.
        self.calibrated = None if self.seed is None else np.interp(np.arange(widths), SIZES, self.seed)
        self.recent = np.full((widths, self.WINDOW), np.inf)  # (width, WINDOW) its last steps' seconds, a ring
        self.steps = np.zeros(widths, dtype=np.int64)  # steps learnt from per width
        self.last = np.zeros(widths, dtype=np.int64)  # the one-row step count at a width's last step
        self.clock = 0  # one-row steps observed
        self._expires = self.MAX_AGE + 1  # no seen width is stale before this step (a later step at it only delays it)
        self.seconds = self.calibrated.copy() if self.calibrated is not None else np.zeros(widths)  # learnt seconds where seen
        self.seen = np.zeros(widths, dtype=np.bool_)  # a width priced by its own recent steps (MEASURED or more)
        self.once = np.full(widths, np.inf)  # an unseen width's one step (inf: none): its price, within ONCE_DEAREST
        self.warm = np.zeros(widths, dtype=np.bool_)  # a width stepped once (its one-time costs paid)
        self.prefill = None  # (tokens, seconds) of a one-row prefill not yet drawn into the chord
        self.slope = np.inf  # the chord's least seconds per extra token so far
        self._anchors()
        self._fixed = None
        self._priced: np.ndarray | None = None  # one_row(64) until the next observe (a step reads it two or three times)

    def observe_prefill(self, rows: int, tokens: int, seconds: float) -> None:
        """Learns from a one-row forward over `tokens` uncached tokens (a prefill) that took `seconds`:
        the unseeded prior's chord is the least slope of the prefills seen (other shapes, and a seeded curve, ignore it)."""
        if rows == 1 and self.seed is None and tokens > 1:
            self.prefill = (tokens, seconds)
            self._chord()

    def _chord(self) -> None:
        if self.prefill is None or not self.seen[1]:
            return
        tokens, seconds = self.prefill
        self.prefill = None
        one = self.seconds[1]
        slope = max(seconds - one, 0.0) / (tokens - 1) * (1 + self.head_ratio)
        if slope >= self.slope:
            return
        self.slope = slope
        self.calibrated = one + slope * (np.arange(SIZES[-1] + 1) - 1.0)
        self.seconds = np.where(self.seen, self.seconds, self.calibrated)
        self._priced = None

    def observe(self, rows: int, width: int, seconds: float) -> None:
        """Learns from a one-row step over `width` tokens (beyond 64: as 64) that took `seconds`
        (other shapes are not on the curve)."""
        if rows != 1:
            return
        w = min(max(width, 1), SIZES[-1])
        self.clock += 1
        if not self.warm[w]:  # the first step at a width carries torch's one-time costs for that shape: not learnt from
            self.warm[w] = True
            return
        self.last[w] = self.clock
        status = observe_width(self.recent, self.steps, self.seconds, self.once, self.seen, w, seconds)
        if status == NEWLY_SEEN or self.clock >= self._expires:
            status = PRICE_CHANGED
            stale = self.seen & (self.clock - self.last > self.MAX_AGE)
            if stale.any():  # forgotten: priced as unseen, and its old steps no longer count
                self.seen[stale] = False
                self.recent[stale] = np.inf
                self.steps[stale] = 0
                if self.calibrated is not None:
                    self.seconds[stale] = self.calibrated[stale]
            self._expires = (self.last[self.seen].min() if self.seen.any() else self.clock) + self.MAX_AGE + 1
            self._anchors()
            self._chord()
        if status:  # priced again when next read
            self._fixed = None
            self._priced = None

    def measured(self, width: int) -> bool:
        """Whether a one-row block of `width` tokens (beyond 64: as 64) is priced by MEASURED recent steps of its own (nothing priced: all)."""
        return self.calibrated is None or bool(self.seen[min(max(width, 1), SIZES[-1])])  # seen: MEASURED steps

    def _anchors(self) -> None:
        # What pricing reads of `seen` (it changes only when a width is first seen): per width,
        # the seen width its estimate starts from, and the nearest seen wider width (a cap; NO_CAP: none).
        last = SIZES[-1]
        widths = np.arange(last + 1)
        below = np.maximum.accumulate(np.where(self.seen, widths, 0))  # nearest seen width <= w (0: none)
        above = np.minimum.accumulate(np.where(self.seen, widths, last + 1)[::-1])[::-1]  # nearest seen width >= w (last + 1: none)
        self._anchor = np.where(below > 0, below, np.where(above <= last, above, widths))
        self._cap = np.where(above <= last, above, NO_CAP)
        self._seen_widths = np.flatnonzero(self.seen)  # narrow to wide
        self._priced = None

    def seconds_at(self, width: int) -> float:
        """The curve's price of a one-row block of `width` tokens, in seconds (a plain step's learnt seconds times its cost)."""
        return self.one_row(width)[width] * self.seconds[1]

    def relative(self) -> np.ndarray:
        """costs[n], n in 0..64, relative to a plain step (costs[0] unused)."""
        return self.one_row(SIZES[-1])

    def one_row(self, last: int) -> np.ndarray:
        """costs[n], n in 0..last, relative to a plain step (index 0 unused); after an `observe`, priced once (price_widths)."""
        if self.calibrated is None:  # no prior yet: a plain step is all that is priced
            return Unpriced().one_row(last)
        if self._priced is None:
            self._priced = price_widths(self.seconds, self.once, self._seen_widths, self._anchor, self._cap, self.calibrated,
                                        self.NOISE, self.seed is None)
        return self._priced[: last + 1] if last < self._priced.shape[0] else extend_linearly(self._priced, last)


@njit(cache=True)
def observe_width(recent, steps, seconds, once, seen, w, value):  # pragma: no cover (compiled)
    """StepCosts.observe's update of width w by a step of `value` seconds: its ring of recent steps, and the price their
    least sets (seconds where seen; until MEASURED steps, once: one step prices it within ONCE_DEAREST of its unseen
    price, price_widths). Returns NEWLY_SEEN where w now has MEASURED steps, else PRICE_CHANGED where a price that
    price_widths reads changed (most steps change none: a width's least step stands), else 0."""
    recent[w, steps[w] % recent.shape[1]] = value
    steps[w] += 1
    least = recent[w, 0]
    for j in range(1, recent.shape[1]):
        least = min(least, recent[w, j])
    priced = seconds if seen[w] else once
    status = PRICE_CHANGED if priced[w] != least else 0
    priced[w] = least
    if w > 1 and seen[1] and least / LEAST_BLOCK < seconds[1]:  # a plain step's own steps may all have stalled,
        seconds[1] = least / LEAST_BLOCK  # and drafting steps never tell it again
        status = PRICE_CHANGED
    if not seen[w] and steps[w] >= MEASURED:
        seen[w], seconds[w], once[w] = True, least, np.inf
        status = NEWLY_SEEN
    return status


@njit(cache=True)
def price_widths(seconds, once, seen_widths, anchor, cap, calibrated, noise, fit):  # pragma: no cover (compiled)
    """StepCosts' relative costs[n], n in 0..128 (index 0: costs[1]): each width up to 64 from its anchor's seconds
    plus the extra seconds between the two, never dearer than its cap's (a seen wider block); a width with one step (`once`)
    is priced by it, at most ONCE_DEAREST times the price above; a seen width within
    `noise` of a narrower seen drafted width's seconds is priced as that width (levelled narrow to wide). The extra:
    the prior's, or with `fit` and two widths seen, the least of the prior's and the seen widths' own line's (the
    median pairwise slope of their levelled seconds, Theil-Sen, at least 0): a prior drawn from one stalled prefill
    is too steep, and the line from a few narrow widths too (on a CPU in float32 they cost most per token). Beyond
    64, along the last segment (extend_linearly's rule: a 64-token chain's sizer reads width 65)."""
    top = seconds.shape[0] - 1
    levelled = seconds.copy()
    level = -1.0
    for w in seen_widths:
        if w == 1:  # a drafted width is never levelled to a plain step: else a draft never kept costs nothing
            continue
        if level >= 0 and levelled[w] <= level * (1 + noise):
            levelled[w] = min(levelled[w], level)  # within noise of a narrower seen block: no dearer
        else:
            level = levelled[w]
    slope = -1.0  # the seen widths' own seconds per width (-1: the prior's differences)
    n = seen_widths.shape[0]
    if fit and n > 1:
        pairs = np.empty(n * (n - 1) // 2)  # Theil-Sen: the median of the pairwise slopes, robust to a stalled width
        k = 0
        for i in range(n):
            for j in range(i + 1, n):
                pairs[k] = (levelled[seen_widths[j]] - levelled[seen_widths[i]]) / (seen_widths[j] - seen_widths[i])
                k += 1
        slope = max(np.median(pairs), 0.0)
    out = np.empty(2 * top + 1)
    for w in range(1, top + 1):
        a, c = anchor[w], cap[w]
        e = levelled[a] + (calibrated[w] - calibrated[a] if slope < 0 else min(slope * (w - a), calibrated[w] - calibrated[a]))
        if c != NO_CAP and levelled[c] < e:
            e = levelled[c]
        if once[w] < ONCE_DEAREST * e:  # one step: its price, up to ONCE_DEAREST times what it would be unseen
            e = once[w]
        elif once[w] < np.inf:
            e = ONCE_DEAREST * e
        out[w] = max(e, 1e-9)
    one = out[1]
    out[0] = one
    out[: top + 1] /= one
    step = out[top] - out[top - 1]
    for n in range(top + 1, 2 * top + 1):  # extend_linearly's rule
        out[n] = max(out[top] + (n - top) * step, LEAST_BLOCK)
    return out


class LineCost:
    """A step costs F + p * rows * width, known through h = F / p alone (`fixed_cost_tokens`)."""

    def __init__(self, fixed_cost_tokens: float):
        if not fixed_cost_tokens > 0:
            raise ValueError(f"fixed_cost_tokens must be > 0, got {fixed_cost_tokens!r}")
        self._fixed = float(fixed_cost_tokens)

    @property
    def fixed_cost_tokens(self) -> float:
        return self._fixed

    def cost(self, rows: int, width):
        """Relative cost of a (rows, width) block; `width` an int or an int array."""
        h = self.fixed_cost_tokens
        return (h + rows * width) / (h + 1)

    def one_row(self, last: int) -> np.ndarray:
        """cost(1, n) for n in 0..last (index 0 unused)."""
        h = self.fixed_cost_tokens
        return (h + np.arange(last + 1)) / (h + 1)

    measured = CostCurve.measured


class StepCostFit(LineCost):
    """The line F + p * tokens learnt from a loop's measured steps: h = F / p.

    A faded least-squares fit pulled toward `prior` (F = prior * p) by a penalty worth `prior_weight`
    samples: steps all of one size leave it at the prior. Clamped to `bounds` (fixed_cost_tokens_of).

    Example:
        >>> fit = StepCostFit(prior=64.0)
        >>> for tokens in (4, 8, 12, 16, 20) * 20:
        ...     fit.observe(1, tokens, 0.010 + 0.001 * tokens)  # F = 10 ms, p = 1 ms: F / p = 10
        >>> round(fit.fixed_cost_tokens, 1)
        10.0
    """

    def __init__(self, prior: float, *, prior_weight: float = 4.0, fade: float = 0.99, bounds=FIXED_COST_BOUNDS):
        if not bounds[0] <= prior <= bounds[1]:
            raise ValueError(f"prior must lie in {bounds}, got {prior!r}")
        super().__init__(prior)
        self.prior = float(prior)
        self.prior_weight = prior_weight
        self.fade = fade
        self.bounds = bounds
        self.samples = 0
        # faded sums over the steps, x = (1, tokens): of x x^T (n, t, tt: its entries) and of x * seconds (s, ts)
        self._sums = [0.0, 0.0, 0.0, 0.0, 0.0]
        # the prior's penalty prior_weight * (F - prior * p)^2 / (1 + prior^2), as w u u^T with u = (1, -prior): its entries
        w = self.prior_weight / (1.0 + self.prior * self.prior)
        self._penalty = (w, -w * self.prior, w * self.prior * self.prior)

    def observe(self, rows: int, width: int, seconds: float) -> None:
        """Learns from a step over a (rows, width) block that took `seconds` (a 2 x 2 solve in floats: once a step)."""
        tokens, f, sums = float(rows * width), self.fade, self._sums
        sums[0] = f * sums[0] + 1.0
        sums[1] = f * sums[1] + tokens
        sums[2] = f * sums[2] + tokens * tokens
        sums[3] = f * sums[3] + seconds
        sums[4] = f * sums[4] + tokens * seconds
        self.samples += 1
        a, b, c = sums[0] + self._penalty[0], sums[1] + self._penalty[1], sums[2] + self._penalty[2]
        det = a * c - b * b
        fixed, per_token = (c * sums[3] - b * sums[4]) / det, (a * sums[4] - b * sums[3]) / det
        self._fixed = fixed_cost_tokens_of(fixed, per_token, self.bounds)


class Unpriced:
    """A cost model with nothing measured yet: a plain step costs 1, any wider block UNPRICED (no draft pays)."""

    fixed_cost_tokens = 1.0

    def cost(self, rows: int, width):
        return np.where(np.asarray(width) <= 1, 1.0, UNPRICED)

    def one_row(self, last: int) -> np.ndarray:
        costs = np.full(last + 1, UNPRICED)
        costs[:2] = 1.0
        return costs

    measured = CostCurve.measured  # nothing to probe before a step is priced


class LoopCosts:
    """What our loop's steps cost: the measured curve for one row (StepCosts), the fitted line for many
    (StepCostFit, its prior the line through a batch's prefill and a plain step after the first; Unpriced until
    both are in), and whether a one-row tree step costs what a chain step of its width does.

    Trees: a tree step's seconds plus its host seconds (a tree step searches wider, reads the model's
    predictions, builds a mask), over the curve's price of its width plus a chain step's host seconds (the
    least of CHAIN_SAMPLES chain steps after the first), the median of TREE_SAMPLES tree steps after the
    first (`tree_trial()` while `trees()` is None); a calibration's ratio decides at once. Decided for
    trees, each tree step teaches the curve its width's price as it costs (docs/design.md, section 4).

    Args:
        seconds: calibrated seconds of a one-row forward pass over SIZES[i] new tokens
            (lookahead.integrations.calibration), or None: learnt from the call's steps.
        tree_over_chain: a calibration's 16-node tree step over its 16-token chain step (nan: no trees), or None: learnt.
        head_ratio: as StepCosts's, for the priors drawn from prefills (the curve's and the line's).
    """

    TREE_SAMPLES = 5  # tree steps timed before trees() decides, without a calibration
    TREE_MAX_OVER_CHAIN = 1 + StepCosts.NOISE  # trees where a tree step costs at most this over a chain step of its width,
    TREE_MAX_PROMISED = 1 + 2 * StepCosts.NOISE  # or up to what its plans promised over their chains, to this (design.md)
    CHAIN_SAMPLES = 4  # one-row chain steps whose host seconds are timed before the tree steps are

    def __init__(self, seconds=None, *, tree_over_chain: float | None = None, head_ratio: float = 0.0):
        self.curve = StepCosts(seconds, head_ratio=head_ratio)
        self.line = StepCostFit(line_through(seconds)) if seconds is not None else None
        self.batch_prefill = None  # (tokens, seconds) of a batched prefill, until the line's prior is drawn from it
        self.batch_warm = False  # a plain batched step was taken (the first is not learnt from)
        self.tree_over_chain = tree_over_chain
        self.tree_ratios = []  # one-row tree steps' seconds over a chain step's of their width, host work included
        self.tree_gains = []  # and what their plans promised over their chains' (StepPlan.gain)
        self.tree_gain = 1.0  # the median of tree_gains once decided (1.0: unknown, as with a calibration's ratio)
        self.tree_warm = False  # a tree step was taken (the first is not learnt from)
        self.chain_hosts = []  # one-row chain steps' host seconds, the first included, until 1 + CHAIN_SAMPLES

    def at(self, rows: int):
        """The cost model a step of `rows` rows is priced by."""
        if rows == 1:
            return self.curve
        return self.line if self.line is not None else Unpriced()

    def observe_prefill(self, rows: int, tokens: int, seconds: float) -> None:
        """Learns from the call's first step: `rows` rows of `tokens` uncached tokens each in `seconds`."""
        if rows == 1:
            self.curve.observe_prefill(1, tokens, seconds)
        elif self.line is None and tokens > 1:
            self.batch_prefill = (rows * tokens, seconds)

    def observe(self, rows: int, width: int, seconds: float, *, tree: bool = False, host: float = 0.0, gain: float = 1.0) -> None:
        """Learns from a step over a (rows, width) block whose forward (with the block built and
        walked) took `seconds`, and the loop's other work for it (planning, bookkeeping) `host`;
        `tree`: the block was a tree, whose plan promised `gain` (StepPlan.gain)."""
        if rows > 1:
            if self.line is None and self.batch_prefill is not None and width == 1:
                if not self.batch_warm:  # the first plain batched step carries its shape's one-time costs
                    self.batch_warm = True
                    return
                tokens, prefill = self.batch_prefill
                per_token = (prefill - seconds) / (tokens - rows) * (1 + self.curve.head_ratio)
                if per_token > 0:  # else the prefill read faster than a plain step: noise, wait for the next
                    self.line = StepCostFit(fixed_cost_tokens_of(seconds - per_token * rows, per_token))
            if self.line is not None:
                self.line.observe(rows, width, seconds)
        elif not tree:
            self.curve.observe(rows, width, seconds)
            if len(self.chain_hosts) <= self.CHAIN_SAMPLES:
                self.chain_hosts.append(host)
        elif self.trees():  # decided for trees: a tree step prices its width as it costs (its host work over a chain step's included)
            self.curve.observe(rows, width, seconds if self.chain_host is None else max(seconds + host - self.chain_host, 1e-9))
        elif self.curve.calibrated is not None and self.trees() is None and self.chain_host is not None:
            if self.tree_warm:
                self.tree_ratios.append((seconds + host) / (self.curve.seconds_at(width) + self.chain_host))
                self.tree_gains.append(gain)
                if len(self.tree_ratios) == self.TREE_SAMPLES:  # decided: read at every step from here on
                    self.tree_over_chain = float(np.median(self.tree_ratios))
                    self.tree_gain = float(np.median(self.tree_gains))
            self.tree_warm = True  # the first tree step: the mask path's one-time costs, not learnt from

    @property
    def chain_host(self) -> float | None:
        """A one-row chain step's host seconds: the least of CHAIN_SAMPLES after the first (a process's first steps carry
        one-time costs, kernels loaded, which would favour trees); None until they are in."""
        return min(self.chain_hosts[1:]) if len(self.chain_hosts) > self.CHAIN_SAMPLES else None

    def tree_trial(self) -> bool:
        """Whether a one-row step, trees undecided, is one of the tree steps that decide (after the chain steps that price a chain's host work)."""
        return self.chain_host is not None

    def tree_ratio(self) -> float | None:
        """A tree step's cost over a chain step's of its width: the calibration's, else the median of
        the TREE_SAMPLES tree steps' (None: not known yet)."""
        return self.tree_over_chain

    def trees(self) -> bool | None:
        """Whether a tree step costs at most TREE_MAX_OVER_CHAIN times a chain step of its width, or at most what
        its trees promised over their chains (tree_gain) within TREE_MAX_PROMISED (None: not known yet)."""
        ratio = self.tree_ratio()
        limit = max(self.TREE_MAX_OVER_CHAIN, min(self.tree_gain, self.TREE_MAX_PROMISED))
        return None if ratio is None else bool(ratio <= limit)
