"""`LookupDrafter`: drafts the continuation of the current suffix from an index over seen tokens."""

import math
from dataclasses import dataclass, field

import numpy as np

from lookahead.index import TokenIndex
from lookahead.integrations.transformers import TransformersAssistant

# Defaults measured with `lookahead replay` on ../shared/traces (README, "Choosing the defaults").
DEFAULT_NUM_DRAFT_TOKENS = 16
DEFAULT_MIN_NGRAM = 1
DEFAULT_MAX_NGRAM = 8
DEFAULT_DRAFT_FACTOR = 3.0

_EMPTY_IDS = np.zeros(0, dtype=np.int64)
_EMPTY_IDS.flags.writeable = False


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
        return cls(token_ids, np.arange(token_ids.shape[0], dtype=np.int64) - 1, match_len)


EMPTY_DRAFT = Draft(_EMPTY_IDS, _EMPTY_IDS, 0)


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
    def tokens_per_step(self) -> float:
        """Mean tokens per verify step (τ); 0.0 before the first step."""
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def record(self, drafted: int, accepted: int = 0) -> None:
        """Counts one verify step that checked `drafted` tokens and kept `accepted` of them."""
        self.drafted_per_step.append(drafted)
        self.accepted_per_step.append(0)
        self.record_accepted(accepted)

    def record_accepted(self, accepted: int) -> None:
        """Sets how many drafted tokens the last step kept."""
        drafted = self.drafted_per_step[-1]
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted must be in [0, drafted={drafted}], got {accepted}")
        self.accepted_per_step[-1] = accepted

    def __repr__(self) -> str:
        return (
            f"DraftStats(steps={self.steps}, drafted={self.drafted}, accepted={self.accepted}, "
            f"tokens_per_step={self.tokens_per_step:.2f})"
        )


class LookupDrafter(TransformersAssistant):
    """Drafts what followed the current suffix the last time it occurred in the sequence.

    Pass it to transformers as `model.generate(**inputs, assistant_model=LookupDrafter())`:
    outputs are token for token those of `model.generate(**inputs)` (greedy) or sampled
    from the same distribution (`do_sample=True`). It indexes the prompt and every
    verified token, never rejected drafts.

    Lifecycle (what a verification loop calls): `reset(prompt_ids)`, then per step
    `propose(max_tokens)` and `extend(verified_ids)`; `stats` describes the call.

    Args:
        num_draft_tokens: most tokens proposed per step.
        min_ngram: shortest suffix that may anchor a draft.
        max_ngram: longest suffix tried; longer matches are preferred.
        draft_factor: a draft anchored on an m-token match has at most ceil(draft_factor * m)
            tokens: short matches predict little, and every drafted token costs verification.
        eos_token_id: token id(s) a draft never runs past (transformers' loop sets it
            from the generation config).

    Example:
        >>> drafter = LookupDrafter(num_draft_tokens=3)
        >>> drafter.reset([1, 2, 3, 4, 1, 2])
        >>> drafter.propose().token_ids.tolist()
        [3, 4, 1]
    """

    def __init__(
        self,
        *,
        num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS,
        min_ngram: int = DEFAULT_MIN_NGRAM,
        max_ngram: int = DEFAULT_MAX_NGRAM,
        draft_factor: float = DEFAULT_DRAFT_FACTOR,
        eos_token_id: int | list[int] | None = None,
    ):
        if not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be a positive int, got {num_draft_tokens!r}")
        if not isinstance(draft_factor, (int, float)) or not draft_factor > 0:
            raise ValueError(f"draft_factor must be a positive number, got {draft_factor!r}")
        self.num_draft_tokens = num_draft_tokens
        self.draft_factor = float(draft_factor)
        self.index = TokenIndex(min_ngram=min_ngram, max_ngram=max_ngram)
        self.eos_token_ids = _as_id_set(eos_token_id)
        self.stats = DraftStats()

    @property
    def min_ngram(self) -> int:
        return self.index.min_ngram

    @property
    def max_ngram(self) -> int:
        return self.index.max_ngram

    def reset(self, prompt_ids=()) -> None:
        """Starts a new sequence: forgets the old one and its stats, indexes `prompt_ids`."""
        self.index.clear()
        self.index.extend(prompt_ids)
        self.stats = DraftStats()

    def extend(self, token_ids) -> None:
        """Appends verified tokens to the sequence."""
        self.index.extend(token_ids)

    def propose(self, max_tokens: int | None = None) -> Draft:
        """Drafts up to `max_tokens` (default num_draft_tokens) tokens to follow the sequence.

        Cost: one index query plus a copy of the draft; independent of the sequence length.
        """
        limit = self.num_draft_tokens if max_tokens is None else min(max_tokens, self.num_draft_tokens)
        if limit <= 0:
            return EMPTY_DRAFT
        match_len, end = self.index.longest_match()
        if match_len == 0:
            return EMPTY_DRAFT
        limit = min(limit, math.ceil(self.draft_factor * match_len))
        token_ids = self.index.continuation(end, limit)
        token_ids = _cut_at_eos(token_ids, self.eos_token_ids)
        if token_ids.shape[0] == 0:
            return EMPTY_DRAFT
        return Draft.chain(token_ids, match_len)


def _as_id_set(token_id) -> frozenset[int]:
    if token_id is None:
        return frozenset()
    if isinstance(token_id, (int, np.integer)):
        return frozenset([int(token_id)])
    if hasattr(token_id, "tolist"):
        token_id = token_id.tolist()
        if isinstance(token_id, int):
            return frozenset([token_id])
    ids = list(token_id)
    if not all(isinstance(t, (int, np.integer)) for t in ids):
        raise TypeError(f"eos_token_id must be an int or a list of ints, got {token_id!r}")
    return frozenset(int(t) for t in ids)


def _cut_at_eos(token_ids: np.ndarray, eos_token_ids: frozenset[int]) -> np.ndarray:
    # A draft stops before an EOS: the model's own token after the accepted prefix is the
    # EOS anyway when it agrees, so drafting it would win nothing.
    for i, token in enumerate(token_ids.tolist()):
        if token in eos_token_ids:
            return token_ids[:i]
    return token_ids
