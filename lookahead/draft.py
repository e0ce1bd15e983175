"""What a drafter proposes (`Draft`), what a step verifies of it (`StepPlan`) and what verification kept (`DraftStats`).

Vocabulary used from the kernels to the command line (and translated from transformers'
`prompt_lookup_num_tokens` / `max_matching_ngram_size` and vLLM's `num_speculative_tokens`
only at those adapters):
- `num_draft_tokens`: most tokens a draft holds (per branch, for a tree);
- `min_ngram` / `max_ngram`: the shortest and longest suffix that may anchor a draft;
- `max_tree_nodes`: most nodes a tree draft holds;
- `match_len`: length of the suffix a draft is anchored on;
- `room`: draft tokens that fit in a step (the step's own token takes the last place);
- a step's block: `rows` x `width` tokens, width = uncached tokens + the longest draft;
- keep chance: the chance that a drafted token is kept (sizing.keep_rate);
- `fixed_cost_tokens` (h = F / p): how many verified tokens cost as much as a step's fixed part;
- τ (`tau`): tokens per verify step, the model's own token included.
"""

from dataclasses import dataclass, field

import numpy as np

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
    tokens would; the keep rate learns from the chain either way (sizing.keep_rate).
    """

    chain: Draft
    draft: Draft
    size: int


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
