"""What a drafter proposes (`Draft`), what a step verifies of it (`StepPlan`), what verification kept
(`DraftStats`, by source), and what a request drives on its drafter (`DraftSource`).

Vocabulary used from the kernels to the command line (and translated from transformers'
`prompt_lookup_num_tokens` / `max_matching_ngram_size` and vLLM's `num_speculative_tokens`
only at those adapters):
- `num_draft_tokens`: most tokens a draft holds (per branch, for a tree);
- `min_ngram` / `max_ngram`: the shortest and longest suffix that may anchor a draft;
- `max_tree_nodes`: most nodes a tree draft holds;
- `match_len`: length of the suffix a draft is anchored on;
- `room`: draft tokens that fit in a step (the step's own token takes the last place);
- a step's block: `rows` x `width` tokens, width = uncached tokens + the longest draft;
- keep chance: the chance that a drafted token is kept (engine.kernels.learn_row);
- `fixed_cost_tokens` (h = F / p): how many verified tokens cost as much as a step's fixed part;
- τ (`tau`): tokens per verify step, the model's own token included;
- source: where a drafted token came from (SOURCES), or `model` for the token a step writes itself.
"""

from array import array
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from lookahead.sources import DOCUMENTS, MEMORY, MODEL, OTHER, OUTPUT, PREDICTIONS, PROMPT, SOURCES  # noqa: F401 (re-exported)
from lookahead.view import render as render_view

# Why a step verified no draft (DraftStats.no_draft); DRAFTED: it verified one. RARELY_KEPT and NOT_PAID are the
# sizer's width 0 (cost_aware), told apart by the request's learnt keep chance: below one half, its drafts were
# mostly rejected; at or above, they were mostly kept but a wider forward pass cost more than they would save.
DRAFTED, NONE_FOUND, RARELY_KEPT, NOT_PAID, NO_ROOM, STOP_STRING = range(6)
NO_DRAFT_REASONS = ("", "no continuation found", "drafts were rarely kept", "verifying more did not pay on this hardware",
                    "no room left before max_new_tokens", "a stop string came next")
RARELY_KEPT_BELOW = 0.5  # a keep chance below this: RARELY_KEPT (0.5 is the chance before anything is learnt)


def no_draft_reason(found: int, room: int, keep_chance) -> int:
    """Why a step verified no draft: none found (`found` drafted tokens available: 0) or no `room` left; else the
    sizer's width 0, RARELY_KEPT or NOT_PAID by `keep_chance()` (called only then: a row's learnt chance)."""
    if not found:
        return NONE_FOUND if room else NO_ROOM
    return RARELY_KEPT if keep_chance() < RARELY_KEPT_BELOW else NOT_PAID


def no_draft_reasons(drafted: np.ndarray, found: np.ndarray, room: np.ndarray, keep_chances: np.ndarray) -> np.ndarray:
    """no_draft_reason over rows, uint8: DRAFTED where drafted > 0, else why (a batch's step, without a call per row)."""
    why = np.where(found > 0, np.where(keep_chances < RARELY_KEPT_BELOW, RARELY_KEPT, NOT_PAID), np.where(room > 0, NONE_FOUND, NO_ROOM))
    return np.where(drafted > 0, DRAFTED, why).astype(np.uint8)


DEFAULT_MAX_TREE_NODES = 64  # most nodes a tree draft holds, unless the caller says: the drafter's and the loops' default

_EMPTY_IDS = np.zeros(0, dtype=np.int64)
_EMPTY_IDS.flags.writeable = False
_CHAIN_PARENTS = np.arange(256, dtype=np.int64) - 1  # [-1, 0, 1, ...]: shared, read-only
_CHAIN_PARENTS.flags.writeable = False
_NO_SOURCES = np.zeros(0, dtype=np.int8)  # a draft made without its sources: counted as OTHER
_NO_SOURCES.flags.writeable = False


@dataclass(frozen=True)
class Draft:
    """Proposed tokens: a tree given by parent indices; a chain has parents [-1, 0, 1, ...].

    `token_ids[i]` follows `parents[i]` (-1: follows the current sequence). An empty
    draft (no proposal; the verifier takes a plain step) has empty arrays.
    `match_len` is the length of the suffix the draft was anchored on (0: none); `sources[i]`
    where token i came from (PROMPT, OUTPUT, ...; empty: not known, counted as OTHER).
    """

    token_ids: np.ndarray  # (num_nodes,) int64
    parents: np.ndarray  # (num_nodes,) int64, parents[i] < i
    match_len: int = 0
    sources: np.ndarray = field(default_factory=lambda: _NO_SOURCES)  # (num_nodes,) int8 SOURCES codes, or (0,): not known

    def __len__(self) -> int:
        return self.token_ids.shape[0]

    @property
    def is_chain(self) -> bool:
        """Whether every node follows the one before it (parents [-1, 0, ..., n - 2]).

        Cost: O(1) for `chain`'s drafts and their prefixes (views of the shared parents from their start: a view's
        base is the array it views); else O(n): as parents[i] <= i - 1, their sum reaches a chain's, n (n - 3) / 2,
        only where every one is i - 1.
        """
        parents, n = self.parents, self.parents.shape[0]
        if n < 2 or (parents.base is _CHAIN_PARENTS and parents[0] == -1 and parents.strides == _CHAIN_PARENTS.strides):  # a prefix of it
            return True
        return int(parents.sum()) == n * (n - 3) // 2

    @classmethod
    def chain(cls, token_ids: np.ndarray, match_len: int = 0, sources: np.ndarray = _NO_SOURCES) -> "Draft":
        n = token_ids.shape[0]
        parents = _CHAIN_PARENTS[:n] if n <= _CHAIN_PARENTS.shape[0] else np.arange(n, dtype=np.int64) - 1
        return cls(token_ids, parents, match_len, sources)

    def prefix(self, num_nodes: int) -> "Draft":
        """The first `num_nodes` nodes (a chain's first tokens; parents precede children, so a subtree)."""
        return Draft(self.token_ids[:num_nodes], self.parents[:num_nodes], self.match_len if num_nodes else 0,
                     self.sources[:num_nodes])

    def source_codes(self) -> np.ndarray:
        """(num_nodes,) int8: each node's source, OTHER where not known."""
        if self.sources.shape[0] == self.token_ids.shape[0]:
            return self.sources
        return np.full(self.token_ids.shape[0], OTHER, dtype=np.int8)


EMPTY_DRAFT = Draft(_EMPTY_IDS, _EMPTY_IDS, 0)


@dataclass(frozen=True)
class StepPlan:
    """One step's drafting: the drafter's chain, the draft verified, and how many chain tokens it stands for.

    `draft` is `chain.prefix(size)`, or a tree with the nodes that cost what `size` chain
    tokens would; the keep rate learns from the chain either way (engine.kernels.learn_row).
    `gain`: a one-row sized tree's expected tokens per step price over its chain's
    (sizing.rules.tree_gain, where the loop asked: Request.commit_tree's promise; else 1.0).
    """

    chain: Draft
    draft: Draft
    size: int
    gain: float = 1.0


@dataclass(frozen=True)
class DraftStats:
    """What a generate call drafted and kept, and why; printed, it says so in plain words.

    A step is one verify forward pass (in a batch, one row's share of it: a row-step); it writes
    `accepted` drafted tokens plus one token of the model's own, so tokens = accepted + steps and
    `tau` = tokens per step. `by_source` counts, per source (the prompt, the output so far,
    documents, memory, the model's predictions), the tokens drafted and kept; a token several
    sources proposed counts for the first that did (the prompt's first occurrence, the request's
    own text, documents, memory, predictions). `no_draft` counts the steps that verified no
    draft, by reason: no continuation found; drafts were rarely kept (the request's learnt keep
    chance below one half); verifying more did not pay on this hardware (a wider forward pass
    costs more than the tokens it would likely save: cost_aware); no room left; a stop string
    came next. `token_ids`, `token_sources` and `token_steps` record each written token;
    `render(tokenizer)` shows the text with each kept draft marked by its source.

    Through transformers' `assistant_model=` loop a step's acceptance is seen at the next step,
    so the last step counts 0 accepted and its tokens are not in `token_ids`.

    Example:
        >>> from lookahead.draft import PROMPT, DraftStats
        >>> stats = DraftStats()
        >>> stats.record(3, sources=np.array([PROMPT] * 3, dtype=np.int8))
        >>> stats.record_accepted(2, written=[7, 8, 9], sources=np.array([PROMPT] * 2, dtype=np.int8))
        >>> print(stats)
        3 tokens in 1 forward pass (3.00 per pass); kept 2 of 3 drafted: prompt 2 of 3
    """

    drafted_per_step: list[int] = field(default_factory=list)
    accepted_per_step: list[int] = field(default_factory=list)
    no_draft_per_step: bytearray = field(default_factory=bytearray)  # (steps,) NO_DRAFT_REASONS codes, DRAFTED: drafted
    # (drafted, kept): each drafted token's SOURCES code, each kept one's, in step order (counted when read: source_counts)
    source_codes: tuple = field(default_factory=lambda: (bytearray(), bytearray()))
    written: tuple = field(default_factory=lambda: (array("q"), bytearray(), array("l")))  # per token written: id, source, step
    rows: int = 1  # rows whose steps these are (a batch's call: every row's, row after row)
    # (sum(drafted_per_step), sum(accepted_per_step)), kept by record, record_accepted and add (the lists' only
    # writers): drafted, accepted, tokens and tau in O(1) a call, not O(steps)
    _totals: array = field(default_factory=lambda: array("q", [0, 0]), init=False, repr=False, compare=False)

    def __post_init__(self):
        self._totals[0], self._totals[1] = sum(self.drafted_per_step), sum(self.accepted_per_step)

    @property
    def steps(self) -> int:
        return len(self.drafted_per_step)

    @property
    def drafted(self) -> int:
        return self._totals[0]

    @property
    def accepted(self) -> int:
        return self._totals[1]

    @property
    def tokens(self) -> int:
        return self.accepted + self.steps

    @property
    def tau(self) -> float:
        """τ: mean tokens per verify step; 0.0 before the first step."""
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def source_counts(self) -> np.ndarray:
        """(2, len(SOURCES)) int64: per source, the tokens drafted (row 0) and kept (row 1)."""
        return np.stack([np.bincount(np.frombuffer(codes, dtype=np.int8), minlength=len(SOURCES)) for codes in self.source_codes])

    @property
    def by_source(self) -> dict[str, tuple[int, int]]:
        """{source: (drafted, kept)} for each source that drafted (SOURCES' order); they sum to (drafted, accepted)."""
        drafted, kept = self.source_counts.tolist()
        return {name: (drafted[i], kept[i]) for i, name in enumerate(SOURCES) if drafted[i]}

    @property
    def no_draft(self) -> dict[str, int]:
        """{reason: steps} for the steps that verified no draft (NO_DRAFT_REASONS' order)."""
        counts = np.bincount(np.frombuffer(self.no_draft_per_step, dtype=np.uint8), minlength=len(NO_DRAFT_REASONS)).tolist()
        return {reason: counts[i] for i, reason in enumerate(NO_DRAFT_REASONS) if i != DRAFTED and counts[i]}

    @property
    def token_ids(self) -> np.ndarray:
        """(written,) int64: the tokens the steps wrote, in order (the call's output, as the drafter saw it)."""
        return np.frombuffer(self.written[0], dtype=np.int64) if len(self.written[0]) else np.zeros(0, dtype=np.int64)

    @property
    def token_sources(self) -> np.ndarray:
        """(written,) int8: each written token's source (SOURCES codes; MODEL: the step's own token)."""
        return np.frombuffer(self.written[1], dtype=np.int8)

    @property
    def token_steps(self) -> np.ndarray:
        """(written,) int64: the step (0-based, an index of drafted_per_step) that wrote each token."""
        return np.frombuffer(self.written[2], dtype=np.int64) if len(self.written[2]) else np.zeros(0, dtype=np.int64)

    def record(self, drafted: int, accepted: int = 0, *, sources=None, no_draft: int = DRAFTED) -> None:
        """Counts one verify step that checked `drafted` tokens and kept `accepted` of them.

        `sources`: (drafted,) each drafted token's SOURCES code (None: OTHER); `no_draft`: with
        drafted == 0, why (NO_DRAFT_REASONS; DRAFTED: not told).
        """
        self.drafted_per_step.append(drafted)
        self.accepted_per_step.append(0)
        self._totals[0] += drafted
        self.no_draft_per_step.append(DRAFTED if drafted else no_draft)
        if not drafted and not accepted:  # (a step per row of a batch: no numpy call where there is nothing to count)
            return
        if sources is not None and len(sources) == drafted:
            self.source_codes[0].extend(np.asarray(sources, dtype=np.int8).tobytes())
        else:
            self.source_codes[0].extend(bytes([OTHER]) * drafted)
        if accepted:
            self.record_accepted(accepted)  # (raises where accepted > drafted)

    def record_accepted(self, accepted: int, *, written=None, sources=None) -> None:
        """Sets how many drafted tokens the last step kept.

        `written`: the tokens the step wrote (its kept drafted tokens, then the model's own; cut where
        generation stopped), recorded per token (token_ids, token_sources, token_steps);
        `sources`: (accepted,) the kept tokens' SOURCES codes (None: OTHER).
        """
        drafted = self.drafted_per_step[-1]
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted must be in [0, drafted={drafted}], got {accepted}")
        self._totals[1] += accepted - self.accepted_per_step[-1]
        self.accepted_per_step[-1] = accepted
        if not accepted:
            codes = b""
        elif sources is not None and len(sources) == accepted:
            codes = np.asarray(sources, dtype=np.int8).tobytes()
        else:
            codes = bytes([OTHER]) * accepted
        self.source_codes[1].extend(codes)
        if written is not None and len(written):
            n = len(written)
            ids, token_codes, steps = self.written
            ids.extend(written)
            token_codes.extend(codes[:n])
            if n > accepted:
                token_codes.append(MODEL)
            steps.extend([self.steps - 1] * n)

    def add(self, other: "DraftStats") -> None:
        """Appends another request's steps (a batch's rows folded into one drafter's stats)."""
        offset = self.steps
        self.drafted_per_step.extend(other.drafted_per_step)
        self.accepted_per_step.extend(other.accepted_per_step)
        self._totals[0] += other._totals[0]
        self._totals[1] += other._totals[1]
        self.no_draft_per_step.extend(other.no_draft_per_step)
        self.source_codes[0].extend(other.source_codes[0])
        self.source_codes[1].extend(other.source_codes[1])
        ids, codes, steps = self.written
        ids.extend(other.written[0])
        codes.extend(other.written[1])
        steps.extend(step + offset for step in other.written[2])

    def render(self, tokenizer, *, html=None, file=None, color: bool | None = None) -> str:
        """Prints the written text with each kept draft marked by its source, and writes an HTML view; returns the text printed.

        Args:
            tokenizer: the model's tokenizer (its `decode`).
            html: a path: also writes a self-contained HTML page there (a legend, the tokens per
                forward pass along the text, each step's underline with a tooltip).
            file: where to print (default sys.stdout; False: nowhere).
            color: ANSI colours (default: where `file` is a terminal), else [source|text] markers.

        Example: `drafter.stats.render(tokenizer, html="drafts.html")` after a generate call.
        """
        return render_view(self, tokenizer, html=html, file=file, color=color)

    def __str__(self) -> str:
        if not self.steps:
            return "no steps yet"
        passes = "forward pass" if self.steps == 1 else "forward passes"
        unit = f"{self.steps} {passes} ({self.tau:.2f} per pass)" if self.rows == 1 else \
            f"{self.steps} row-steps of {self.rows} rows ({self.tau:.2f} per row-step)"
        text = f"{self.tokens} tokens in {unit}"
        if self.drafted:
            text += f"; kept {self.accepted} of {self.drafted} drafted"
            text += ": " + ", ".join(f"{name} {kept} of {drafted}" for name, (drafted, kept) in self.by_source.items())
        skipped = self.no_draft
        if skipped:
            steps = sum(skipped.values())
            text += f"; no draft on {steps} step{'s' if steps > 1 else ''} (" + ", ".join(f"{n} {why}" for why, n in skipped.items()) + ")"
        return text

    __repr__ = __str__


@runtime_checkable
class DraftSource(Protocol):
    """What a request (lookahead.request.Request) and the loops over it call on a drafter.

    `LookupDrafter` answers it whatever it drafts from: lookup alone (`predictions=False`),
    the model's prediction table alone (`lookup = False`) or their blend (the default).
    One request at a time: `reset(prompt_ids)` starts one; each step `propose` (a chain),
    `propose_tree`, or `propose(hedged=True)` then `_likeliest_tree` or `_grow_tree` (a tree from
    the same candidates); then `extend` with the tokens the model wrote and `_record_predictions` with
    its top-k after each block entry; `finish()` ends it. Drafts never hold a rejected token.

    Example:
        >>> from lookahead import LookupDrafter
        >>> drafter = LookupDrafter(num_draft_tokens=2, memory=False)
        >>> isinstance(drafter, DraftSource)
        True
        >>> drafter.reset([5, 6, 7, 5])
        >>> draft = drafter.propose()
        >>> draft.token_ids.tolist(), drafter.num_tokens
        ([6, 7], 4)
        >>> drafter.stats.record(len(draft), accepted=2)  # a loop's bookkeeping (Request keeps it)
        >>> drafter.extend([6, 7, 8])
        >>> drafter.finish()  # filed into memory (here none); the stats still describe the request
        >>> drafter.num_tokens, drafter.stats.accepted
        (0, 2)
    """

    stats: DraftStats  # the current request's steps (Request.commit / verified record them); the last one's after finish

    @property
    def max_ngram(self) -> int:
        """Longest suffix a draft is anchored on: a Draft's match_len is in [0, max_ngram]."""

    @property
    def num_tokens(self) -> int:
        """Tokens of the request seen so far: the prompt, then every extend."""

    @property
    def tokens(self) -> np.ndarray:
        """(num_tokens,) those tokens, a read-only view, stale after the next extend, reset or finish."""

    def reset(self, prompt_ids) -> None:
        """Starts a request on `prompt_ids` (ending the current one as `finish` does); `stats` start empty."""

    def finish(self) -> None:
        """Ends the current request: what it taught is kept for later requests, its tokens dropped; `stats` stay."""

    def extend(self, token_ids) -> None:
        """Appends tokens the model wrote (never a rejected draft token)."""

    def propose(self, num_draft_tokens: int | None = None, *, hedged: bool = False) -> Draft:
        """A chain of at most `num_draft_tokens` tokens after the tokens seen (EMPTY_DRAFT: none).
        `hedged`: from a tree's candidates, which `_grow_tree` then drafts from."""

    def propose_tree(self, num_draft_tokens: int | None = None, *, max_tree_nodes: int = DEFAULT_MAX_TREE_NODES) -> Draft:
        """A tree of at most `max_tree_nodes` nodes, branches at most `num_draft_tokens` deep."""

    def _grow_tree(self, max_tree_nodes: int) -> Draft:
        """The tree of the last `propose(..., hedged=True)`'s candidates, at most `max_tree_nodes` nodes."""

    def _likeliest_tree(self, max_tree_nodes: int, keep_chance: float) -> tuple[Draft, np.ndarray, tuple]:
        """The last `propose(..., hedged=True)`'s candidates the model likeliest writes, likeliest first (at most
        `max_tree_nodes`; every prefix a tree), each one's chance, lookup's next token kept with `keep_chance`, and
        what the source's `tree_chances.observe` learns from once they are verified: (estimates, which are the table's)."""

    def _record_predictions(self, inputs, predicted) -> None:
        """The model's likeliest next tokens after each of `inputs` ((n,) ids; predicted (n, k) ids, likeliest first),
        after `extend` with the step's tokens. A source that drafts without them ignores them."""
