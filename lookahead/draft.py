"""What a drafter proposes (`Draft`), what a step verifies of it (`StepPlan`), what verification kept
(`DraftStats`), and what a request drives on its drafter (`DraftSource`).

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
- τ (`tau`): tokens per verify step, the model's own token included.
"""

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

DEFAULT_MAX_TREE_NODES = 64  # most nodes a tree draft holds, unless the caller says: the drafter's and the loops' default

_EMPTY_IDS = np.zeros(0, dtype=np.int64)
_EMPTY_IDS.flags.writeable = False
_CHAIN_PARENTS = np.arange(256, dtype=np.int64) - 1  # [-1, 0, 1, ...]: shared, read-only
_CHAIN_PARENTS.flags.writeable = False


@dataclass(frozen=True)
class Draft:
    """Proposed tokens: a tree given by parent indices; a chain has parents [-1, 0, 1, ...].

    `token_ids[i]` follows `parents[i]` (-1: follows the current sequence). An empty
    draft (no proposal; the verifier takes a plain step) has empty arrays.
    `match_len` is the length of the suffix the draft was anchored on (0: none).
    """

    token_ids: np.ndarray  # (num_nodes,) int64
    parents: np.ndarray  # (num_nodes,) int64, parents[i] < i
    match_len: int = 0

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
    def chain(cls, token_ids: np.ndarray, match_len: int = 0) -> "Draft":
        n = token_ids.shape[0]
        parents = _CHAIN_PARENTS[:n] if n <= _CHAIN_PARENTS.shape[0] else np.arange(n, dtype=np.int64) - 1
        return cls(token_ids, parents, match_len)

    def prefix(self, num_nodes: int) -> "Draft":
        """The first `num_nodes` nodes (a chain's first tokens; parents precede children, so a subtree)."""
        return Draft(self.token_ids[:num_nodes], self.parents[:num_nodes], self.match_len if num_nodes else 0)


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


@dataclass
class DraftStats:
    """What a drafter proposed and what verification kept, over one generate call.

    A step is one verify forward pass; it produces `accepted` drafted tokens plus one
    token of the model's own, so tokens = accepted + steps. Through transformers' loop a
    step's acceptance is seen at the next step, so the last step counts 0 accepted.
    """

    drafted_per_step: list[int] = field(default_factory=list)
    accepted_per_step: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.drafted_per_step)

    @property
    def drafted(self) -> int:
        return sum(self.drafted_per_step)

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_step)

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

    def record(self, drafted: int, accepted: int = 0) -> None:
        """Counts one verify step that checked `drafted` tokens and kept `accepted` of them."""
        self.drafted_per_step.append(drafted)
        self.accepted_per_step.append(0)
        self.record_accepted(accepted)

    def add(self, other: "DraftStats") -> None:
        """Appends another request's steps (a batch's rows folded into one drafter's stats)."""
        self.drafted_per_step += other.drafted_per_step
        self.accepted_per_step += other.accepted_per_step

    def record_accepted(self, accepted: int) -> None:
        """Sets how many drafted tokens the last step kept."""
        drafted = self.drafted_per_step[-1]
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted must be in [0, drafted={drafted}], got {accepted}")
        self.accepted_per_step[-1] = accepted

    def __repr__(self) -> str:
        return (
            f"DraftStats(steps={self.steps}, drafted={self.drafted}, accepted={self.accepted}, "
            f"tau={self.tau:.2f})"
        )


@runtime_checkable
class DraftSource(Protocol):
    """What a request (lookahead.request.Request) and the loops over it call on a drafter.

    `LookupDrafter` answers it whatever it drafts from: lookup alone (`predictions=False`),
    the model's prediction table alone (`lookup = False`) or their blend (the default).
    One request at a time: `reset(prompt_ids)` starts one; each step `propose` (a chain),
    `propose_tree`, or `propose(hedged=True)` then `likeliest_tree` or `grow_tree` (a tree from
    the same candidates); then `extend` with the tokens the model wrote and `record_predictions` with
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
        what the source's `tree_chances.observe(*learnt, kept)` learns from once they are verified."""

    def _record_predictions(self, inputs, predicted) -> None:
        """The model's likeliest next tokens after each of `inputs` ((n,) ids; predicted (n, k) ids, likeliest first),
        after `extend` with the step's tokens. A source that drafts without them ignores them."""
