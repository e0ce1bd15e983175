"""The one place that knows transformers' private shapes: frames, caches, the assistant protocol.

transformers' assisted loop (`GenerationMixin._assisted_decoding`) wraps an
`assistant_model` in an `AssistedCandidateGenerator`, which each step calls
`assistant_model.generate(input_ids, max_new_tokens, generation_config, ...)` and reads
`.sequences`, `.scores` and `.cache` from the result. A `LookupDrafter` forwards those
calls to its `TransformersAssistant`, which answers them from the drafter's
`reset`/`extend`/`propose`, so no transformers code is patched.

What the candidate generator relies on, and how we answer:
- `.scores`: stacked into candidate logits. Greedy verification ignores them, so they are
  (1, 1) placeholders. Sampling runs `_speculative_sampling`, which needs q over the
  target's vocabulary: our proposal is a point mass, so q is one-hot and the rule
  "accept d with prob min(1, p(d)/q(d)) = p(d), else sample from (p - q)+" is exactly
  sampling from p.
- `.cache`: threaded back into the next call's kwargs. We return None; the key "cache"
  is absent only on the first call of a generate(), which is how a new request is seen.
- `.config` and `.device`: read while transformers validates the call and builds the
  candidate generator. Their getters read the caller's arguments there (its frame) to
  refuse what the loop cannot do with a clear message, and to learn the target model.

- Stop strings: the loop checks its stopping criteria after each step, on the sequence's
  last token only, so a stop string completed inside an accepted block would be missed.
  A draft is therefore cut before its first token that completes one (`first_stop`): if
  the model writes that token, it is the step's own, the block's last, and the loop sees it.

Frames read (each has a test in tests/test_transformers_frames.py that fails the day
transformers moves it): `_validate_generation_mode` (locals self, generation_mode,
generation_config), `AssistedCandidateGenerator.__init__` (input_ids, model_kwargs),
`_assisted_decoding` (stopping_criteria) and `generate` (streamer, which transformers
does not forward to a custom_generate).
"""

import copy
import functools
import sys
import threading
import time
import weakref
from types import SimpleNamespace

import numpy as np
import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList
from transformers.cache_utils import DynamicLayer
from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor, RepetitionPenaltyLogitsProcessor
from transformers.generation.stopping_criteria import StopStringCriteria

from lookahead.errors import UnsupportedGenerationError
from lookahead.sizing import DraftSizer, plan_step

_ALTERNATIVE = "Call generate once per sequence with num_beams=1 and the default dynamic cache."
_FRAMES_SEARCHED = 4  # how far up the stack a transformers caller is looked for


class _AssistantConfig(SimpleNamespace):
    """The slice of a model config that transformers reads from an assistant."""

    def get_text_config(self, decoder=None):
        return self


class TransformersAssistant:
    """A drafter's answers to transformers' assisted loop, and that loop's per-request state.

    The drafter provides `reset(prompt_ids)`, `extend(ids)`, `propose(num_draft_tokens) -> Draft`,
    `num_draft_tokens`, `max_ngram`, `cost_aware`, `index` (its TokenIndex),
    `eos_option` / `eos_token_ids` and `stats` (a DraftStats). With `cost_aware`, each
    draft is cut to what verifying it on the target pays for (lookahead.sizing).
    """

    def __init__(self, drafter):
        self.drafter = drafter
        # What `config` learns about the target, per thread: another thread's call (refused
        # at its first step) must not change it under a running one.
        self._target = threading.local()
        self.indexed = 0  # tokens of the current request the drafter has seen
        self.sizer: DraftSizer | None = None  # the request's sizer when cost_aware
        self.sized = None  # (chain draft, tokens of it offered, position) of the last step, for the sizer
        self.step_started = None  # (perf_counter, block width) of the last step, timed when it follows the prefill
        self.stop_strings: list[StopStringCriteria] = []  # the request's, from the loop's stopping criteria

    # -- attributes transformers reads ------------------------------------------------------

    @property
    def config(self) -> _AssistantConfig:
        """Side effect: read inside transformers' `_validate_generation_mode`, it refuses
        options the loop cannot verify and records the target model."""
        caller = caller_locals("_validate_generation_mode")
        if caller is not None:
            _check_generation_mode(caller)
            target = caller["self"]
            self._target.vocab_size = vocab_size(target)
            self._target.device = target.device
            self._target.model = weakref.ref(target)  # for the cost calibration
        return _AssistantConfig(is_encoder_decoder=False, vocab_size=self.target_vocab_size)

    @property
    def target_vocab_size(self) -> int | None:
        return getattr(self._target, "vocab_size", None)

    @property
    def device(self) -> torch.device:
        """Side effect: read inside the candidate generator's `__init__`, it refuses batches and static caches."""
        caller = caller_locals("__init__")
        if caller is not None and "input_ids" in caller and "model_kwargs" in caller:
            _check_candidate_generator_inputs(caller["input_ids"], caller["model_kwargs"])
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

    def _new_sizer(self) -> DraftSizer | None:
        target = getattr(self._target, "model", None)
        model = target() if target is not None else None
        if not self.drafter.cost_aware or model is None:
            return None
        from lookahead.integrations.calibration import step_costs

        return DraftSizer(step_costs(model), self.drafter.max_ngram)

    # -- the call the candidate generator makes each step ----------------------------------

    def generate(self, input_ids, *, max_new_tokens, generation_config, **kwargs):
        """Returns the sequence with a draft of at most `max_new_tokens` tokens appended.

        Raises:
            DrafterInUseError: another thread's request holds or took over the drafter.
        """
        if input_ids.shape[0] != 1:
            raise UnsupportedGenerationError(
                f"LookupDrafter drafts for one sequence, got batch size {input_ids.shape[0]}. {_ALTERNATIVE}"
            )
        # One step at a time: between this request's steps another thread's request may
        # start (reset); then this request's next extend raises, before any state is read.
        new_request = "cache" not in kwargs
        if new_request:
            loop = caller_locals("_assisted_decoding")
            criteria = loop.get("stopping_criteria") if loop is not None else None
            self.stop_strings = [c for c in criteria or () if isinstance(c, StopStringCriteria)]
        with self.drafter.exclusive():
            return self._step(input_ids, max_new_tokens, generation_config, new_request=new_request)

    def _step(self, input_ids, max_new_tokens: int, generation_config, *, new_request: bool):
        drafter = self.drafter
        if new_request or input_ids.shape[1] <= self.indexed:
            drafter.eos_token_ids = _eos_ids(generation_config, drafter.eos_option)
            if self.target_vocab_size is not None:
                drafter.vocab_size = self.target_vocab_size  # drafts never hold an id the target cannot take
            drafter.reset(input_ids[0])
            self.sizer = self._new_sizer()
        else:
            verified = input_ids[0, self.indexed :]
            drafter.extend(verified)  # first: from a thread whose request was taken over, it raises
            # The loop appended the accepted drafts plus one token of the model's own.
            drafter.stats.record_accepted(min(verified.shape[0] - 1, drafter.stats.drafted_per_step[-1]))
            if self.sizer is not None:
                if self.step_started is not None:  # the loop's own time for a verify step of that width
                    started, width = self.step_started
                    self.sizer.timed(width, time.perf_counter() - started)
                if self.sized is not None:  # what the last step drafted, against what the model wrote
                    chain, offered, position = self.sized
                    self.sizer.observed(chain.match_len, chain.token_ids.tolist(), offered, verified.tolist(), position)
                self.sizer.settle(drafter.index.tokens)
        self.indexed = input_ids.shape[1]

        chain, draft, size = plan_step(drafter, self.sizer, max_new_tokens)
        token_ids = draft.token_ids
        if self.stop_strings and token_ids.shape[0]:
            token_ids = token_ids[: first_stop(self.stop_strings, input_ids[0], token_ids)]
            size = min(size, token_ids.shape[0])
        self.sized = (chain, size, self.indexed) if self.sizer is not None and len(chain) else None
        sampling = bool(generation_config.do_sample)
        if sampling and token_ids.shape[0] == 0 and max_new_tokens > 0:
            # The sampling branch needs at least one candidate (an empty block breaks its
            # slicing); the last token is a free guess: a wrong one costs one verified position.
            token_ids = np.asarray([int(input_ids[0, -1])], dtype=np.int64)
        drafter.stats.record(token_ids.shape[0])
        # Timed from here to the next call: the target's verify forward and the loop around it;
        # the first step of a request also prefills the prompt, so it is not timed.
        self.step_started = (time.perf_counter(), token_ids.shape[0] + 1) if not new_request else None

        device = input_ids.device
        candidates = torch.tensor(token_ids.tolist(), dtype=input_ids.dtype, device=device)[None, :]
        sequences = torch.cat((input_ids, candidates), dim=1)
        if sampling:
            scores = _one_hot_scores(candidates[0], self.target_vocab_size, device)
        else:
            placeholder = torch.zeros((1, 1), device=device)
            scores = (placeholder,) * max(1, token_ids.shape[0])
        return SimpleNamespace(sequences=sequences, scores=scores, cache=None)


# -- frames ---------------------------------------------------------------------------------


def caller_locals(function_name: str) -> dict | None:
    """Locals of the nearest transformers frame named `function_name` among our callers' callers, if any."""
    frame = sys._getframe(2)
    for _ in range(_FRAMES_SEARCHED):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name == function_name and "/transformers/" in code.co_filename.replace("\\", "/"):
            return frame.f_locals
        frame = frame.f_back
    return None


def streamer_dropped_by_transformers():
    """The `streamer` a user passed to model.generate(custom_generate=...), which transformers does not forward.

    Read from transformers' generate frame, our caller's caller; None if the caller is anything else.
    """
    caller = caller_locals("generate")
    return caller.get("streamer") if caller is not None else None


def first_stop(criteria: list[StopStringCriteria], sequence: torch.Tensor, draft: np.ndarray) -> int:
    """The first i at which sequence + draft[: i + 1] ends in a completed stop string; len(draft) if none.

    One call per criterion, batched over the draft's prefixes: row i holds the last
    `maximum_token_len` tokens of sequence + draft[: i + 1] (the most a criterion reads; it
    matches at the end of its input), padded on the left with an id past the criterion's
    vocabulary, which matches nothing. Cost: O(len(draft) * maximum_token_len) per criterion.
    """
    k = draft.shape[0]
    for criterion in criteria:
        window = criterion.maximum_token_len
        no_match = criterion.embedding_vec.shape[0] - 1  # the criterion's dummy row: ids past its vocabulary land there
        tail = sequence[-window:].tolist()
        ids = torch.full((k, window), no_match, dtype=torch.long)
        for i in range(k):
            row = (tail + draft[: i + 1].tolist())[-window:]
            ids[i, window - len(row) :] = torch.tensor(row)
        done = criterion(ids.to(sequence.device), None).nonzero()
        if done.numel():
            k = int(done[0, 0])
    return k


# -- caches and model capabilities -----------------------------------------------------------


def new_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


def drop_cache_tail(cache: DynamicCache, count: int) -> None:
    """Removes the last `count` cached positions (transformers 5: a negative crop removes that many)."""
    if count > 0:
        cache.crop(-count)


def keep_cache_positions(cache: DynamicCache, positions: torch.Tensor) -> None:
    """Keeps only the cached positions `positions` (ascending int64), in every layer."""
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(-2, positions.to(layer.keys.device))
        layer.values = layer.values.index_select(-2, positions.to(layer.values.device))


def gather_cache_rows(cache: DynamicCache, rows: torch.Tensor, positions: torch.Tensor) -> None:
    """Keeps the batch rows `rows` ((kept,) int64) and, in row i, the cached positions positions[i] ((kept, length) int64), in every layer."""
    for layer in cache.layers:
        index = positions.to(layer.keys.device)[:, None, :, None]
        keys, values = layer.keys.index_select(0, rows.to(layer.keys.device)), layer.values.index_select(0, rows.to(layer.keys.device))
        layer.keys = keys.gather(2, index.expand(-1, keys.shape[1], -1, keys.shape[3]))
        layer.values = values.gather(2, index.expand(-1, values.shape[1], -1, values.shape[3]))


def gather_cache_tail(cache: DynamicCache, start: int, positions: torch.Tensor) -> None:
    """Row i's slots start + j become its slots start + positions[i, j] ((rows, length) int64, offsets from
    start), in place; the cache then ends at start + length. Only the tail is moved, not the whole cache."""
    for layer in cache.layers:
        index = positions.to(layer.keys.device)[:, None, :, None]
        end = start + positions.shape[1]
        for name in ("keys", "values"):
            tensor = getattr(layer, name)
            tail = tensor[:, :, start:].gather(2, index.expand(-1, tensor.shape[1], -1, tensor.shape[3]))
            tensor[:, :, start:end] = tail
            setattr(layer, name, tensor[:, :, :end])


def cache_rows_gatherable(cache: DynamicCache) -> bool:
    """Whether every layer is a plain DynamicLayer (a sliding-window layer cannot be gathered per row)."""
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def row_processors(processors, row: int, batch: int):
    """The logits processors as they act on row `row` of a `batch`-row batch, called with that row alone.

    Most processors read only the ids they are given. Two keep per-row state: the repetition
    penalty's prompt_ignore_length (each row's left padding, set by generate from the mask)
    and prefix_allowed_tokens_fn's batch id; their copies here see the row's own.
    """
    rows = []
    for processor in processors:
        if isinstance(processor, RepetitionPenaltyLogitsProcessor) and isinstance(processor.prompt_ignore_length, torch.Tensor):
            processor = copy.copy(processor)
            processor.prompt_ignore_length = processor.prompt_ignore_length[row : row + 1]
        elif isinstance(processor, PrefixConstrainedLogitsProcessor) and batch > 1:
            processor = copy.copy(processor)
            processor._prefix_allowed_tokens_fn = functools.partial(_as_row, processor._prefix_allowed_tokens_fn, row)
        rows.append(processor)
    return LogitsProcessorList(rows)


def _as_row(allowed_tokens, row: int, batch_id: int, ids):
    return allowed_tokens(row, ids)


def pad_token_id(config: GenerationConfig) -> int | None:
    """The id plain generate writes after a row's end (transformers' prepared pad: pad_token_id, else the first EOS)."""
    pad = getattr(config, "_pad_token_tensor", None)
    if pad is not None:
        return int(pad.reshape(-1)[0])
    return config.pad_token_id


def vocab_size(model) -> int:
    """The ids the model takes and scores: [0, vocab_size)."""
    return model.config.get_text_config().vocab_size


def supports_logits_to_keep(model) -> bool:
    """Whether the model's forward takes `logits_to_keep` (inspects its signature: call once, not per step)."""
    return model._supports_logits_to_keep()


# -- checks ---------------------------------------------------------------------------------


def _one_hot_scores(candidates: torch.Tensor, vocab_size: int | None, device) -> tuple[torch.Tensor, ...]:
    """Logits of a point-mass proposal: 0 at the drafted token, -inf elsewhere. One (1, vocab) per token."""
    if vocab_size is None:
        raise RuntimeError("the target's vocabulary size is unknown: use the drafter through model.generate()")
    logits = torch.full((candidates.shape[0], vocab_size), float("-inf"), device=device)
    logits[torch.arange(candidates.shape[0], device=device), candidates] = 0.0
    return tuple(logits[i : i + 1] for i in range(candidates.shape[0]))


def _eos_ids(generation_config, fallback):
    eos = generation_config.eos_token_id
    if eos is None:
        return fallback
    eos = [eos] if isinstance(eos, int) else list(eos)
    return frozenset(int(t) for t in eos) | fallback


def _check_generation_mode(caller: dict) -> None:
    mode = caller.get("generation_mode")
    config = caller.get("generation_config")
    target = caller.get("self")
    if mode is not None and str(getattr(mode, "value", mode)) != "assisted_generation":
        raise UnsupportedGenerationError(
            f"LookupDrafter works with greedy search and sampling, but these options select "
            f"'{getattr(mode, 'value', mode)}' (num_beams={getattr(config, 'num_beams', None)}); "
            f"transformers would silently ignore the drafter. {_ALTERNATIVE}"
        )
    if config is not None and config.cache_implementation in ("static", "offloaded_static", "sliding_window", "hybrid"):
        raise UnsupportedGenerationError(
            f"LookupDrafter needs a cache that can drop rejected drafts; cache_implementation="
            f"'{config.cache_implementation}' cannot. {_ALTERNATIVE}"
        )
    if target is not None and target.config.is_encoder_decoder:
        raise UnsupportedGenerationError(
            f"LookupDrafter drafts for decoder-only models; {type(target).__name__} is an encoder-decoder. "
            "Use a decoder-only model, or generate without assistant_model."
        )


def _check_candidate_generator_inputs(input_ids, model_kwargs: dict) -> None:
    if input_ids.shape[0] != 1:
        raise UnsupportedGenerationError(
            f"LookupDrafter drafts for one sequence, but the batch has {input_ids.shape[0]}: transformers' "
            f"assisted loop verifies batch size 1 only. {_ALTERNATIVE}"
        )
    cache = model_kwargs.get("past_key_values", model_kwargs.get("cache"))
    if cache is not None and "Static" in type(cache).__name__:
        raise UnsupportedGenerationError(
            f"LookupDrafter needs a cache that can drop rejected drafts; {type(cache).__name__} cannot. {_ALTERNATIVE}"
        )
