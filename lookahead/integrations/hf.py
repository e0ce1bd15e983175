"""The one place that knows transformers' private shapes: frames, caches, processors, forward keywords.

Frames read (each has a test in tests/integrations/test_hf.py that fails the day
transformers moves it): `_validate_generation_mode` (locals self, generation_mode,
generation_config), `AssistedCandidateGenerator.__init__` (input_ids, model_kwargs),
`_assisted_decoding` (stopping_criteria) and `generate` (streamer, which transformers
does not forward to a custom_generate). Caches: transformers 5's DynamicCache and its
layers (`crop`, `layers[i].keys/values`; from 5.25, `activate_past_recording`'s
`recurrent_states_to_keep`). Processors with per-row state: the repetition
penalty's prompt_ignore_length and prefix_allowed_tokens_fn's batch id.
"""

import copy
import dataclasses
import functools
import inspect
import sys

import numpy as np
import torch
import transformers
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList
from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor, RepetitionPenaltyLogitsProcessor
from transformers.generation.stopping_criteria import StopStringCriteria
from transformers.generation.utils import GenerateDecoderOnlyOutput


FRAMES_SEARCHED = 4  # how far up the stack a transformers caller is looked for
TRANSFORMERS_VERSION = tuple(int(part) for part in transformers.__version__.split(".")[:2])
# From transformers 5.25 a recurrent (state-space, linear-attention) layer can roll its state back,
# when told before a forward how many of its last tokens a crop may remove (keep_rollback).
RECURRENT_ROLLBACK = TRANSFORMERS_VERSION >= (5, 25)


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
    """The cache plain generate builds for `model`, recording its past as transformers' assisted loop does.

    Recording: a sliding-window or convolution layer keeps the states a rollback may need
    (not only its window) until the next `crop`, so every step can drop its rejected tokens;
    a recurrent layer keeps what keep_rollback asks for (here: a crop of none).
    """
    cache = DynamicCache(config=model.config)
    if RECURRENT_ROLLBACK:
        keep_rollback(cache, 1)
    else:
        cache.activate_past_recording()
    return cache


def keep_rollback(cache: DynamicCache, tokens: int) -> None:
    """Lets a crop after the next forward remove up to `tokens` - 1 of its tokens, or all of them if it has
    no more than `tokens`. A recurrent layer then keeps its state before each of its last `tokens` tokens
    (that many states of memory per layer, and those tokens run one at a time through its scan); other
    layers record their past regardless. Call it before every forward whose tokens may be rolled back
    (about 1 us a call on a 24-layer cache)."""
    if RECURRENT_ROLLBACK:
        cache.activate_past_recording(recurrent_states_to_keep=tokens)


def drop_cache_tail(cache: DynamicCache, count: int) -> None:
    """Removes the last `count` >= 0 cached positions, as transformers' assisted loop rolls back (`crop(-count)`).

    Called after every verify step, `count` 0 included: on a recording sliding-window or
    convolution layer the crop also cuts the recorded past back to what the next step reads.
    (transformers 5: a negative crop removes that many; crop(0) leaves full-attention layers as they are.)
    """
    cache.crop(-count)


def decoder_only_output(*, sequences, scores=None, logits=None, cache=None) -> GenerateDecoderOnlyOutput:
    """What plain generate returns with return_dict_in_generate; the cache under its field's name
    (`cache`, or `past_key_values` before transformers 5.2x)."""
    fields = {field.name for field in dataclasses.fields(GenerateDecoderOnlyOutput)}
    name = "cache" if "cache" in fields else "past_key_values"
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits, **{name: cache})


def cache_inputs(model, cache) -> dict:
    """The forward's keyword arguments that pass `cache`: its name is `cache` (transformers >= 5.2x) or
    `past_key_values` (earlier 5.x), read from the forward's signature once per class."""
    return {cache_keyword(type(model)): cache, "use_cache": True}


def chain_positions(model, start: int, length: int, device) -> dict:
    """position_ids (1, length) = start..start + length - 1 where plain generate passes them (the forward takes
    position_ids), else {}: a family that would compute its own (RoBERTa-style: offset from the padding id) gets
    the ones plain generate gives it."""
    if not takes(type(model), "position_ids"):
        return {}
    return {"position_ids": torch.arange(start, start + length, device=device)[None]}


@functools.cache
def takes(model_class, name: str) -> bool:
    """Whether the model class's forward takes the keyword `name` (read once per class)."""
    return name in inspect.signature(model_class.forward).parameters


@functools.cache
def cache_keyword(model_class) -> str | None:
    """The forward's name for the KV cache (None: it takes none)."""
    for name in ("cache", "past_key_values"):
        if takes(model_class, name):
            return name
    return None


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


def head_ratio(model) -> float:
    """What scoring one token (the output layer) costs over the rest of its forward, in weights read
    and multiplied: the output layer's parameters over those of the layers between (the input
    embedding is a lookup). 0.0 where the model has no separate output layer to weigh.

    Example: Qwen2-0.5B's shape at a 128k vocabulary about 0.3; Llama-3.1-8B's 0.08.
    """
    head = model.get_output_embeddings()
    embed = model.get_input_embeddings()
    if head is None or getattr(head, "weight", None) is None or embed is None:
        return 0.0
    total = sum(p.numel() for p in model.parameters())  # a tied output layer is counted once, as the embedding
    tied = head.weight is embed.weight
    body = total - embed.weight.numel() - (0 if tied else head.weight.numel())
    return head.weight.numel() / body if body > 0 else 0.0


def supports_logits_to_keep(model) -> bool:
    """Whether the model's forward takes `logits_to_keep`: its class's, read once per class (an instance whose
    forward was replaced, by accelerate's hooks say, is read itself: transformers' own check, tens of µs)."""
    if "forward" in vars(model):
        return model._supports_logits_to_keep()
    return takes(type(model), "logits_to_keep")
