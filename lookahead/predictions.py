"""`PredictionTable`: the model's own top-k next tokens after each token id, recycled into drafts (numpy, numba).

Every verify pass computes the model's distribution at every position of its block and
keeps one token of it. The table keeps, for each token id t, the k ids the model ranked
highest the last time t was an input (Token Recycling, ACL 2025):

    ids  int32[rows, k]   # ids[t, r]: the model's (r+1)-th likeliest next token the last time t was an input; -1: none

Rows grow to the largest input seen (the vocabulary, once the loop has seen it): bounded by
vocab x k x 4 bytes, 4 MB at 128k ids and k = 8. Writes take the table's lock; drafts read
without it (a row torn by a concurrent write is a worse draft, never a wrong output: every
draft is verified, and every stored id is in [0, rows) or -1).

How a drafter uses it (LookupDrafter, `predictions=`): the loop records each step's top-k
(`record`), the drafter counts at which rank of the table's row each token the model wrote
stood before that step's record (`rank_counts`: the rank keep chances), and drafts a
best-first expansion of the rows from the last token (trie.add_predictions).
"""

import threading

import numpy as np
from numba import njit

DEFAULT_TOP_K = 8  # the model's k likeliest next tokens kept per input id (Token Recycling's 8)
NO_TABLE = np.zeros((0, 0), dtype=np.int32)  # a table's ids with no rows: what a draft reads where it reads none


@njit(cache=True)
def record_rows(ids, inputs, predicted):  # pragma: no cover (compiled)
    """ids[inputs[i]] = predicted[i]'s first k ids (k = ids.shape[1]; -1 past predicted's width, and for a negative id),
    for each i in order (a later input of the same id wins); negative inputs skipped. Returns 0, or, where an input or a
    kept id has no row, the rows needed (the largest + 1) and writes nothing: grow the table and call again. O(n * k)."""
    rows, k = ids.shape
    width = min(k, predicted.shape[1])
    largest = -1
    for i in range(inputs.shape[0]):
        largest = max(largest, inputs[i])
        for r in range(width):
            largest = max(largest, predicted[i, r])
    if largest >= rows:
        return largest + 1
    for i in range(inputs.shape[0]):
        t = inputs[i]
        if t < 0:
            continue
        for r in range(k):
            v = predicted[i, r] if r < width else -1
            ids[t, r] = v if v >= 0 else -1
    return 0


@njit(cache=True)
def rank_counts(ids, tokens, start, counts):
    """For each i in [max(start, 1), len(tokens)) whose previous token has a row: counts[r] += 1 where
    tokens[i] == ids[tokens[i - 1], r], counts[k] += 1 where it is at no rank. O(n * k)."""
    rows, k = ids.shape
    for i in range(max(start, 1), tokens.shape[0]):
        prev = tokens[i - 1]
        if prev < 0 or prev >= rows or ids[prev, 0] < 0:
            continue
        rank = k
        for r in range(k):
            if ids[prev, r] == tokens[i]:
                rank = r
                break
        counts[rank] += 1


class PredictionTable:
    """The model's top-k next tokens after each token id, the last time it was an input.

    One table may serve many drafters (a batch's rows, threads): pass it as
    `LookupDrafter(predictions=table)`. It belongs to one model: another model's
    predictions only make worse drafts (never wrong outputs), so give each model its own.

    Args:
        k: next tokens kept per input id (the loops record the model's top-k).

    Example:
        >>> table = PredictionTable(k=2)
        >>> table.record([5, 7], [[7, 3], [1, 2]])
        >>> table.row(5).tolist(), table.row(7).tolist(), table.row(1).tolist()
        ([7, 3], [1, 2], [-1, -1])
    """

    def __init__(self, *, k: int = DEFAULT_TOP_K):
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 64:
            raise ValueError(f"k must be an int in [1, 64], got {k!r}")
        self.k = k
        self.ids = np.full((0, k), -1, dtype=np.int32)  # (rows, k), see the module docstring; replaced (never resized in place) when it grows
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Rows (input ids) the table has room for."""
        return self.ids.shape[0]

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes

    def reserve(self, rows: int) -> None:
        """Makes room for input ids below `rows` (the model's vocabulary), keeping what is recorded."""
        with self._lock:
            self._grow(rows)

    def _grow(self, rows: int) -> None:
        if rows > self.ids.shape[0]:
            grown = np.full((rows, self.k), -1, dtype=np.int32)
            grown[: self.ids.shape[0]] = self.ids
            self.ids = grown  # readers holding the old array keep a consistent (older) copy

    def record(self, inputs, predicted) -> None:
        """Row inputs[i] becomes predicted[i] (the model's likeliest next tokens after inputs[i], likeliest first).

        Args:
            inputs: (n,) token ids, the block entries the model predicted from.
            predicted: (n, k') ids: the first k are kept (fewer: the rest of the row is -1, none).
        """
        inputs = np.ascontiguousarray(inputs, dtype=np.int64).reshape(-1)
        predicted = np.asarray(predicted)
        if predicted.ndim != 2 or predicted.shape[0] != inputs.shape[0] or predicted.shape[1] < 1:
            raise ValueError(f"predicted must be ({inputs.shape[0]}, k) ids, got shape {predicted.shape}")
        if inputs.shape[0] == 0:
            return
        if predicted.dtype.kind != "i":
            predicted = predicted.astype(np.int64)
        with self._lock:
            rows = record_rows(self.ids, inputs, predicted)
            if rows:  # every id recorded has a row
                self._grow(rows)
                record_rows(self.ids, inputs, predicted)

    def row(self, token_id: int) -> np.ndarray:
        """The k ids recorded after `token_id`, likeliest first (-1: none), a copy."""
        ids = self.ids
        return ids[token_id].copy() if 0 <= token_id < ids.shape[0] else np.full(self.k, -1, dtype=np.int32)

    def clear(self) -> None:
        with self._lock:
            self.ids = np.full((0, self.k), -1, dtype=np.int32)


# RankChances' and LeadChances' estimates, as kernels over their counts: a LookupDrafter's classes call them (through
# .py_func), engine.trees' rows call them on one row's counts each.
RANK_PRIOR_WEIGHT = 4.0
RANK_PRIOR = (0.4, 0.1, 0.05, 0.03, 0.02, 0.02, 0.01, 0.01)  # a guess, outweighed after a few dozen tokens
LEAD_PRIOR_WEIGHT = 2.0
LEAD_PRIOR = 0.5
# old counts' weight at each observation, which adds one count (a step's first token): 1 / (1 - LEAD_FADE) = 20
# observations' memory. Not the keep rate's (engine.kernels.FADE: 10 updates of up to K + 1 counts each): another count per update.
LEAD_FADE = 0.95


def rank_prior(k: int) -> np.ndarray:
    """(k,) float64: RANK_PRIOR's first k chances (0 past its end)."""
    prior = np.zeros(k, dtype=np.float64)
    prior[: min(k, len(RANK_PRIOR))] = RANK_PRIOR[:k]
    return prior


@njit(cache=True, inline="always")
def rank_chances(counts, prior, out):
    """out[r] (r < k): the chance that the model's next token stands at rank r, from counts (k + 1,) and prior (k,)."""
    seen = 0.0
    for r in range(counts.shape[0]):
        seen += counts[r]
    for r in range(prior.shape[0]):
        out[r] = (counts[r] + RANK_PRIOR_WEIGHT * prior[r]) / (seen + RANK_PRIOR_WEIGHT)


@njit(cache=True, inline="always")
def lead_chance(hits, seen, match_len):
    """The chance that lookup's heaviest first token, anchored on match_len tokens, is the model's next token."""
    m = min(match_len, hits.shape[0] - 1)
    return (hits[m] + LEAD_PRIOR_WEIGHT * LEAD_PRIOR) / (seen[m] + LEAD_PRIOR_WEIGHT)


@njit(cache=True, inline="always")
def lead_written(hits, seen, m, kept):
    """Counts one first token drafted at (capped) match length m: kept (1.0) or not (0.0)."""
    hits[m] = LEAD_FADE * hits[m] + kept
    seen[m] = LEAD_FADE * seen[m] + 1.0


class RankChances:
    """A request's estimate of the chance that the model's next token stands at rank r of the table's row
    for the token before it, r = 0..k-1 (the rest: at none).

    Counts over the tokens the model wrote (`observe`), each against the row as it was before
    that step recorded its own predictions, plus RANK_PRIOR_WEIGHT pseudo-tokens of RANK_PRIOR; a drafter
    kept across requests carries the last ones' counts into the next at a share (`carry`).
    """

    def __init__(self, k: int):
        self.counts = np.zeros(k + 1, dtype=np.float64)  # (k + 1,) tokens at each rank; [k]: at none
        self.prior = rank_prior(k)

    def observe(self, table: PredictionTable, tokens: np.ndarray, start: int) -> None:
        """Counts tokens[start:] (int32 ids, each following the one before it) against `table`."""
        if table.ids.shape[0]:
            rank_counts(table.ids, tokens, start, self.counts)

    def carry(self, share: float) -> None:
        """A new request on the same table: what the last ones counted weighs `share` of itself."""
        self.counts *= share

    def chances(self) -> np.ndarray:
        """(k,) float64: the chance of each rank."""
        out = np.empty(self.prior.shape[0], dtype=np.float64)
        rank_chances.py_func(self.counts, self.prior, out)
        return out


class LeadChances:
    """A request's estimate, per anchor match length m, of the chance that lookup's heaviest first token
    is the model's next token: faded counts (LEAD_FADE per observation) plus LEAD_PRIOR_WEIGHT pseudo-counts of LEAD_PRIOR.

    It puts lookup's candidates and the table's paths on one scale: lookup's heaviest first
    token stands for this chance, the table's paths for their probabilities (RankChances).
    """

    def __init__(self, max_ngram: int):
        self.hits = np.zeros(max_ngram + 1, dtype=np.float64)  # per match length: faded count of first tokens kept
        self.seen = np.zeros(max_ngram + 1, dtype=np.float64)  # and of first tokens drafted
        self.pending: tuple[int, int] | None = None  # (match length, token) of the draft being verified

    def carry(self, share: float) -> None:
        """A new request: what the last ones counted weighs `share` of itself."""
        self.hits *= share
        self.seen *= share
        self.pending = None

    def drafted(self, match_len: int, token: int) -> None:
        """Lookup's heaviest first token this step, anchored on match_len tokens."""
        self.pending = (min(match_len, self.hits.shape[0] - 1), token)

    def written(self, token: int) -> None:
        """The model's next token: counts the pending first token kept or not."""
        if self.pending is not None:
            m, drafted = self.pending
            lead_written.py_func(self.hits, self.seen, m, float(drafted == token))
            self.pending = None


TREE_BANDS = np.array([0.01, 0.03, 0.1, 0.3])  # TreeChances' band edges of a node's estimate
# A guess, outweighed after a tree or two: a node the candidates hold at all is written with about 1% chance
# (stories260K, every node verified: 0.2-1.8% below an estimate of 1%, by source and greedy or sampled).
# Optimistic where verifying is nearly free, so that a new drafter tries its thin nodes and learns their worth.
TREE_PRIOR_ERROR = np.array([0.01, 0.0, 0.0, 0.0, 0.0])  # per band, either source's
TREE_PRIOR_NODES = 64.0  # pseudo-nodes of TREE_PRIOR_ERROR per cell: one tree's worth


class TreeChances:
    """What a tree node's estimated chance (DraftTrie.likeliest) is worth: learnt from the nodes verified.

    The estimate prices a node by its candidates' weights, and each source's weights say
    something different. Where the candidates say little (a thin branch) it falls below what
    such nodes keep (a node any candidate holds is written with some chance of its own); a
    table node the lookup candidates did not hold, priced by the table's rank chances over
    every position, sits where lookup and the table disagree, and is kept far less often than
    estimated while lookup's are kept more (docs/design.md, section 2's predictions). So the nodes a step tells are
    counted per source (lookup's, the table's) in bands of their estimate (TREE_BANDS), and a
    node's chance is its estimate plus its cell's mean error so far (kept minus estimated,
    per node, shrunk toward TREE_PRIOR_ERROR by TREE_PRIOR_NODES pseudo-nodes), within [0, 1]
    (likeliest_nodes applies it: `correction`). Kept by the drafter across its requests: a
    kept drafter starts each request from what the last ones taught.
    """

    def __init__(self):
        # [0]: per source (0: lookup's, 1: the table's) and band, the nodes told; [1]: their summed (written - estimate)
        self.cells = np.zeros((2, 2, len(TREE_BANDS) + 1))
        self.errors = np.empty((2, len(TREE_BANDS) + 1))  # per cell, its mean error (correction's), kept by observe_told
        mean_errors(self.cells, self.errors)

    @property
    def nodes(self) -> np.ndarray:
        return self.cells[0]

    @property
    def error(self) -> np.ndarray:
        return self.cells[1]

    def correction(self, first_class: int) -> tuple:
        """likeliest_nodes' correction for a trie whose nodes from `first_class` on are the table's."""
        return first_class, TREE_BANDS, self.errors

    def observe(self, parents: np.ndarray, nodes: int, frontier: bool, written: np.ndarray, estimates: np.ndarray,
                table: np.ndarray) -> None:
        """Learns from a step that verified the first `nodes` of a likeliest tree (its `parents`, parents first);
        `frontier`: the step wrote the model's own token after the kept nodes; per node, `written` (bool) whether the
        model wrote its path, `estimates` its estimate and `table` whether it is the table's.

        Learnt from: the nodes the step told the truth of, each counted in its cell with whether the model wrote its
        path. The verified nodes, and, with `frontier`, the unverified nodes whose parent was verified (or is the
        root): the model wrote a token after every kept node and none after the others, so each frontier node was
        written or not, as surely as a verified one. Which nodes form the frontier is fixed before the step, so they
        are a fair sample of the nodes a sizer weighs next: a thin node the sizer never buys is still learnt from.
        Deeper unverified nodes are left out: whether a node below the model's own token is written is not yet told,
        and counting only those told would favour the unwritten. Cost: one kernel call, O(len(parents) * bands)."""
        observe_told(parents, nodes, nodes if frontier else -1, written, estimates, table, self.cells, self.errors)


@njit(cache=True)
def observe_told(parents, nodes, frontier, written, estimates, table, cells, errors):  # pragma: no cover (compiled)
    """TreeChances.observe's pass: each told node (i < nodes, or parents[i] < frontier) counted in its cell (table[i],
    its estimate's band: the TREE_BANDS edges at or below it), cells[0] += 1 and cells[1] += written[i] -
    estimates[i], the step's sums added to the totals once, cell by cell (as np.bincount would); then `errors`
    (mean_errors). O(n * bands)."""
    step = np.zeros(cells.shape)
    for i in range(parents.shape[0]):
        if i < nodes or parents[i] < frontier:
            band = 0
            while band < TREE_BANDS.shape[0] and TREE_BANDS[band] <= estimates[i]:
                band += 1
            source = 1 if table[i] else 0
            step[0, source, band] += 1.0
            step[1, source, band] += (1.0 if written[i] else 0.0) - estimates[i]
    cells += step
    mean_errors(cells, errors)


@njit(cache=True)
def mean_errors(cells, errors):  # pragma: no cover (compiled)
    """errors[s, b]: cell (s, b)'s summed error over its nodes, with TREE_PRIOR_NODES pseudo-nodes of TREE_PRIOR_ERROR[b]."""
    for s in range(errors.shape[0]):
        for b in range(errors.shape[1]):
            errors[s, b] = (cells[1, s, b] + TREE_PRIOR_NODES * TREE_PRIOR_ERROR[b]) / (cells[0, s, b] + TREE_PRIOR_NODES)


def warm_up() -> int:
    """Compiles the kernels on a small real input; returns the count of ranked tokens (2 when both ran)."""
    table = PredictionTable(k=2)
    table.record(np.array([1, 2]), np.array([[2, 0], [1, 3]]))
    counts = np.zeros(3, dtype=np.float64)
    rank_counts(table.ids, np.array([1, 2, 1], dtype=np.int32), 1, counts)
    return int(counts.sum())
