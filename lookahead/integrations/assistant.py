"""`TransformersAssistant`: a drafter's answers to transformers' assisted loop (`assistant_model=`).

transformers' assisted loop (`GenerationMixin._assisted_decoding`) wraps an
`assistant_model` in an `AssistedCandidateGenerator`, which each step calls
`assistant_model.generate(input_ids, max_new_tokens, generation_config, ...)` and reads
`.sequences`, `.scores` and `.cache` from the result. A `LookupDrafter` forwards those
calls to its `TransformersAssistant`, which answers them through the request's state
(lookahead.request), so no transformers code is patched.

What the candidate generator relies on, and how we answer:
- `.scores`: stacked into candidate logits. Greedy verification ignores them, so they are
  (1, 1) placeholders. Sampling runs `_speculative_sampling`, which needs q over the
  target's vocabulary: our proposal is a point mass, so q is one-hot and the rule
  "accept d with prob min(1, p(d)/q(d)) = p(d), else sample from (p - q)+" is exactly
  sampling from p.
- `.cache` (`.past_key_values` before transformers 5.2x): threaded back into the next call's
  kwargs. We return None; the key is absent only on the first call of a generate(), which is
  how a new request is seen.
- `.config` and `.device`: read while transformers validates the call and builds the
  candidate generator. Their getters read the caller's arguments there (its frame) to
  refuse what the loop cannot do with a clear message, and to learn the target model.
- Stop strings: the loop checks its stopping criteria after each step, on the sequence's
  last token only, so a stop string completed inside an accepted block would be missed.
  A draft is therefore cut before its first token that completes one (`first_stop`): if
  the model writes that token, it is the step's own, the block's last, and the loop sees it.
- A step's verified tokens are seen at the next call, so the last step of a request
  counts 0 accepted and its block never reaches the drafter.
"""

import threading
import time
import weakref
from types import SimpleNamespace

import numpy as np
import torch
from transformers import GenerationConfig
from transformers.generation.stopping_criteria import StopStringCriteria

from lookahead.draft import DRAFTED, STOP_STRING, Draft
from lookahead.errors import UnsupportedGenerationError
from lookahead.integrations.calibration import step_costs
from lookahead.integrations.hf import caller_locals, first_stop, vocab_size
from lookahead.integrations.support import BATCH_ALTERNATIVE, check_candidate_generator_inputs, check_generation_mode, eos_ids
from lookahead.request import Request
from lookahead.sizing.rules import chain_size


class AssistantConfig(SimpleNamespace):
    """The slice of a model config that transformers reads from an assistant."""

    def get_text_config(self, decoder=None):
        return self


class TransformersAssistant:
    """A drafter's answers to transformers' assisted loop, and that loop's per-request state.

    The drafter is a LookupDrafter: a draft.DraftSource, driven through the request's state
    (lookahead.request.Request), and `num_draft_tokens`, `cost_aware`, `eos_option` /
    `eos_token_ids`, `vocab_size` and `_exclusive()`. With `cost_aware`, each draft is cut to
    what verifying it on the target pays for (lookahead.sizing).
    """

    def __init__(self, drafter):
        self.drafter = drafter
        # What `config` learns about the target, per thread: another thread's call (refused
        # at its first step) must not change it under a running one.
        self._target = threading.local()
        self.request: Request | None = None  # the current request's state
        self.indexed = 0  # tokens of the current request the drafter has seen
        self.costs = None  # its StepCosts (one row), when cost_aware and the target is known
        self.step_started = None  # (perf_counter, block width, whether it was the request's prefill) of the last step
        self.stop_strings: list[StopStringCriteria] = []  # the request's, from the loop's stopping criteria
        self.placeholder = None  # the (1, 1) scores offered with greedy drafts

    # -- attributes transformers reads ------------------------------------------------------

    @property
    def config(self) -> AssistantConfig:
        """Side effect: read inside transformers' `_validate_generation_mode`, it refuses
        options the loop cannot verify and records the target model."""
        caller = caller_locals("_validate_generation_mode")
        if caller is not None:
            check_generation_mode(caller)
            target = caller["self"]
            self._target.vocab_size = vocab_size(target)
            self._target.device = target.device
            self._target.model = weakref.ref(target)  # for the cost calibration
        return AssistantConfig(is_encoder_decoder=False, vocab_size=self.target_vocab_size)

    @property
    def target_vocab_size(self) -> int | None:
        return getattr(self._target, "vocab_size", None)

    @property
    def device(self) -> torch.device:
        """Side effect: read inside the candidate generator's `__init__`, it refuses batches and static caches."""
        caller = caller_locals("__init__")
        if caller is not None and "input_ids" in caller and "model_kwargs" in caller:
            check_candidate_generator_inputs(caller["input_ids"], caller["model_kwargs"])
        return getattr(self._target, "device", None) or torch.device("cpu")

    @property
    def generation_config(self) -> GenerationConfig:
        # "constant": transformers must not resize our drafts; threshold 0 keeps its
        # confidence-based (sklearn) path off, which would read our placeholder scores.
        return GenerationConfig(
            num_assistant_tokens=self.drafter.num_draft_tokens,
            num_assistant_tokens_schedule="constant",
            assistant_confidence_threshold=0.0,
        )

    # -- the call the candidate generator makes each step ----------------------------------

    def generate(self, input_ids, *, max_new_tokens, generation_config, **kwargs):
        """Returns the sequence with a draft of at most `max_new_tokens` tokens appended.

        Raises:
            DrafterInUseError: another thread's request holds or took over the drafter.
        """
        if input_ids.shape[0] != 1:
            raise UnsupportedGenerationError(
                f"LookupDrafter drafts for one sequence, got batch size {input_ids.shape[0]}. {BATCH_ALTERNATIVE}"
            )
        # One step at a time: between this request's steps another thread's request may
        # start (reset); then this request's next extend raises, before any state is read.
        new_request = "cache" not in kwargs and "past_key_values" not in kwargs  # the key's name before transformers 5.2x
        if new_request:
            loop = caller_locals("_assisted_decoding")
            criteria = loop.get("stopping_criteria") if loop is not None else None
            self.stop_strings = [c for c in criteria or () if isinstance(c, StopStringCriteria)]
        with self.drafter._exclusive():
            return self._step(input_ids, max_new_tokens, generation_config, new_request=new_request)

    def _start(self, input_ids, generation_config) -> None:
        drafter = self.drafter
        drafter.eos_token_ids = eos_ids(generation_config) | drafter.eos_option
        if self.target_vocab_size is not None:
            drafter.vocab_size = self.target_vocab_size  # drafts never hold an id the target cannot take
        target = getattr(self._target, "model", None)
        model = target() if target is not None else None
        self.costs = step_costs(model) if drafter.cost_aware and model is not None else None
        self.request = Request(drafter, sized=self.costs is not None)
        self.request.start(input_ids[0])

    def _step(self, input_ids, max_new_tokens: int, generation_config, *, new_request: bool):
        request = self.request
        if new_request or request is None or input_ids.shape[1] <= self.indexed:
            self._start(input_ids, generation_config)
            request = self.request
        else:
            # The loop appended the accepted drafts plus one token of the model's own.
            request.verified(input_ids[0, self.indexed :])  # first: from a thread whose request was taken over, it raises
            if self.costs is not None and self.step_started is not None:  # the loop's own time for a verify step of that width
                started, width, prefill = self.step_started
                if prefill:  # the request's first step: the prompt and its draft in one forward, the cost curve's far end
                    self.costs.observe_prefill(1, width, time.perf_counter() - started)
                else:
                    self.costs.observe(1, width, time.perf_counter() - started)
        self.indexed = input_ids.shape[1]

        chain, size, draft, no_draft = self._draft(request, input_ids, max_new_tokens)
        sampling = bool(generation_config.do_sample)
        if not len(draft) and max_new_tokens > 0:  # the last token read only here: a device sync on a GPU
            last, eos = int(input_ids[0, -1]), self.drafter.eos_token_ids
            if sampling or last in eos:
                # A free guess (a wrong one costs one verified position): the sampling branch needs at
                # least one candidate (an empty block breaks its slicing); and before transformers 5.2x
                # the loop checks its stopping criteria on the candidates, so an empty draft after a
                # prompt ending in EOS ended generation where plain generate writes on. Never an EOS.
                guess = last if sampling and last not in eos else next(t for t in range(len(eos) + 1) if t not in eos)
                draft = Draft.chain(np.asarray([guess], dtype=np.int64))
        request.commit(chain, size, draft, no_draft=no_draft)
        # Timed from here to the next call: the target's verify forward and the loop around it
        # (the request's first: the prefill, the prompt and the draft in one forward of `width` tokens).
        self.step_started = (time.perf_counter(), (input_ids.shape[1] if new_request else 1) + len(draft), new_request)

        device = input_ids.device
        if len(draft):  # a non-empty draft's ids are a fresh array (the trie's path): shared, not copied, on the CPU
            candidates = torch.from_numpy(draft.token_ids).to(device=device, dtype=input_ids.dtype)[None, :]
            sequences = torch.cat((input_ids, candidates), dim=1)
        else:
            candidates, sequences = input_ids[:, :0], input_ids
        if sampling:
            scores = one_hot_scores(candidates[0], self.target_vocab_size, device)
        else:  # never read for greedy (transformers stacks them): one placeholder per device, made once
            if self.placeholder is None or self.placeholder.device != device:
                self.placeholder = torch.zeros((1, 1), device=device)
            scores = (self.placeholder,) * max(1, len(draft))
        return SimpleNamespace(sequences=sequences, scores=scores, cache=None, past_key_values=None)  # the cache's two names

    def _draft(self, request: Request, input_ids, room: int) -> tuple[Draft, int, Draft, int]:
        """(the chain, the tokens of it offered, the chain cut to them and before a stop string's completion,
        STOP_STRING where that cut it to none, else DRAFTED: Request.commit reads why)."""
        chain = request.propose(room)
        size, no_draft = len(chain), DRAFTED
        if self.costs is not None and size:
            size = chain_size(request.keep_chance(chain), size, self.costs)
        if self.stop_strings and size:
            size = first_stop(self.stop_strings, input_ids[0], chain.token_ids[:size])
            no_draft = DRAFTED if size else STOP_STRING
        return chain, size, chain.prefix(size), no_draft


def one_hot_scores(candidates: torch.Tensor, vocab_size: int | None, device) -> tuple[torch.Tensor, ...]:
    """Logits of a point-mass proposal: 0 at the drafted token, -inf elsewhere. One (1, vocab) per token."""
    if vocab_size is None:
        raise RuntimeError("the target's vocabulary size is unknown: use the drafter through model.generate()")
    logits = torch.full((candidates.shape[0], vocab_size), float("-inf"), device=device)
    logits[torch.arange(candidates.shape[0], device=device), candidates] = 0.0
    return tuple(logits[i : i + 1] for i in range(candidates.shape[0]))
