"""The one place that knows transformers' private shapes: frames, caches, processors, refusals.

Frames read (each has a test in tests/test_transformers_frames.py that fails the day
transformers moves it): `_validate_generation_mode` (locals self, generation_mode,
generation_config), `AssistedCandidateGenerator.__init__` (input_ids, model_kwargs),
`_assisted_decoding` (stopping_criteria) and `generate` (streamer, which transformers
does not forward to a custom_generate). Caches: transformers 5's DynamicCache and its
layers (`crop`, `layers[i].keys/values`). Processors with per-row state: the repetition
penalty's prompt_ignore_length and prefix_allowed_tokens_fn's batch id.
"""

import copy
import functools
import sys

import numpy as np
import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList
from transformers.cache_utils import DynamicLayer
from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor, RepetitionPenaltyLogitsProcessor
from transformers.generation.stopping_criteria import StopStringCriteria

from lookahead.errors import UnsupportedGenerationError
from lookahead.index import as_id_set

ALTERNATIVE = "Call generate once per sequence with num_beams=1 and the default dynamic cache."
FRAMES_SEARCHED = 4  # how far up the stack a transformers caller is looked for
# Families whose attention applies a custom 4D mask and whose cache layers can be gathered.
TREE_MODEL_TYPES = {"llama", "qwen2", "mistral", "phi3"}  # each tested for exact tree verification


# -- frames ---------------------------------------------------------------------------------


def caller_locals(function_name: str) -> dict | None:
    """Locals of the nearest transformers frame named `function_name` among our callers' callers, if any."""
    frame = sys._getframe(2)
    for _ in range(FRAMES_SEARCHED):
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


def eos_ids(config: GenerationConfig) -> frozenset[int]:
    """The generation config's EOS ids (none: empty)."""
    return as_id_set(config.eos_token_id)


def fixed_cache(cache_implementation: str | None, cache) -> str | None:
    """What in a call asks for a cache that cannot drop rejected drafts (None: nothing)."""
    if cache_implementation in ("static", "offloaded_static", "sliding_window", "hybrid"):
        return f"cache_implementation='{cache_implementation}'"
    if cache is not None and "Static" in type(cache).__name__:
        return f"a {type(cache).__name__}"
    return None


def check_generation_mode(caller: dict) -> None:
    mode = caller.get("generation_mode")
    config = caller.get("generation_config")
    target = caller.get("self")
    if mode is not None and str(getattr(mode, "value", mode)) != "assisted_generation":
        raise UnsupportedGenerationError(
            f"LookupDrafter works with greedy search and sampling, but these options select "
            f"'{getattr(mode, 'value', mode)}' (num_beams={getattr(config, 'num_beams', None)}); "
            f"transformers would silently ignore the drafter. {ALTERNATIVE}"
        )
    fixed = fixed_cache(config.cache_implementation if config is not None else None, None)
    if fixed is not None:
        raise UnsupportedGenerationError(f"LookupDrafter needs a cache that can drop rejected drafts; {fixed} cannot. {ALTERNATIVE}")
    if target is not None and target.config.is_encoder_decoder:
        raise UnsupportedGenerationError(
            f"LookupDrafter drafts for decoder-only models; {type(target).__name__} is an encoder-decoder. "
            "Use a decoder-only model, or generate without assistant_model."
        )


def check_candidate_generator_inputs(input_ids, model_kwargs: dict) -> None:
    if input_ids.shape[0] != 1:
        raise UnsupportedGenerationError(
            f"LookupDrafter drafts for one sequence, but the batch has {input_ids.shape[0]}: transformers' "
            f"assisted loop verifies batch size 1 only. {ALTERNATIVE}"
        )
    fixed = fixed_cache(None, model_kwargs.get("past_key_values", model_kwargs.get("cache")))
    if fixed is not None:
        raise UnsupportedGenerationError(f"LookupDrafter needs a cache that can drop rejected drafts; {fixed} cannot. {ALTERNATIVE}")


def check_input_ids(input_ids, model) -> None:
    """(batch, prompt_len) integer ids the model takes; refused here, not deep inside torch."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch tensor of token ids, shape (batch, prompt_len), got {type(input_ids).__name__}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must be integers, got a tensor of dtype {input_ids.dtype}")
    if input_ids.ndim != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must have shape (batch, prompt_len) with both >= 1, got {tuple(input_ids.shape)}")
    low, high, vocab = int(input_ids.min()), int(input_ids.max()), vocab_size(model)
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise ValueError(f"input_ids must be in [0, {vocab}) (the model's vocabulary), got {bad}")


def check_generate(model, input_ids, config: GenerationConfig, kwargs: dict) -> None:
    """Refuses what lookahead.generate cannot verify exactly, in one line each."""
    if model.config.is_encoder_decoder:
        raise UnsupportedGenerationError(f"lookahead.generate drafts for decoder-only models; {type(model).__name__} is an encoder-decoder")
    if config.return_dict_in_generate and (config.output_attentions or config.output_hidden_states):
        asked = "output_attentions" if config.output_attentions else "output_hidden_states"
        raise UnsupportedGenerationError(
            f"lookahead.generate returns sequences, scores, logits and the cache, not attentions or hidden states ({asked}=True): "
            "a verify step computes them for a block of draft tokens, not one token at a time. Generate without the drafter for them."
        )
    if (config.num_return_sequences or 1) > 1:
        raise UnsupportedGenerationError(
            f"lookahead.generate returns one sequence per call, got num_return_sequences={config.num_return_sequences}: "
            "call it once per sequence wanted (sampling draws anew each call)"
        )
    if (config.num_beams or 1) > 1:
        raise UnsupportedGenerationError(f"lookahead.generate does greedy search and sampling, not beam search (num_beams={config.num_beams})")
    fixed = fixed_cache(config.cache_implementation, kwargs.get("cache", kwargs.get("past_key_values")))
    if fixed is None and config.cache_implementation not in (None, "dynamic"):
        fixed = f"cache_implementation='{config.cache_implementation}'"  # our loop makes its own DynamicCache
    if fixed is not None:
        raise UnsupportedGenerationError(f"lookahead.generate keeps its own dynamic cache; {fixed} is not supported")
    mask = kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        if tuple(mask.shape) != tuple(input_ids.shape) or mask.ndim != 2:
            raise UnsupportedGenerationError(f"attention_mask must be 2-D like input_ids {tuple(input_ids.shape)}, got {tuple(mask.shape)}")
        real = mask.bool()
        left_padded = bool((real[:, 1:] >= real[:, :-1]).all()) and bool(real[:, -1].all())
        if not left_padded:
            raise UnsupportedGenerationError(
                "lookahead.generate takes left-padded batches, as transformers pads for generation "
                "(tokenizer.padding_side='left'): each attention_mask row must be zeros, then ones, ending in a one"
            )


def tree_unsupported_reason(model) -> str | None:
    """Why a tree cannot be verified on `model` (None: it can)."""
    config = model.config
    if config.model_type not in TREE_MODEL_TYPES:
        return (f"{type(model).__name__} ({config.model_type}) is not among the families tested with custom 4D "
                f"masks, {sorted(TREE_MODEL_TYPES)}")
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return f"{type(model).__name__} uses a sliding-window cache (sliding_window={config.sliding_window}), whose layers cannot be gathered"
    if set(getattr(config, "layer_types", None) or ["full_attention"]) != {"full_attention"}:
        return f"{type(model).__name__} has layers other than full attention ({sorted(set(config.layer_types))})"
    return None
