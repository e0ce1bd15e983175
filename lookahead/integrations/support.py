"""What a model and a call support: the refusals at each entry point, declared or found by a probe.

Every refusal is one line of UnsupportedGenerationError naming the limitation and what to do
instead, raised before any forward pass where the model declares it (before transformers 5.25,
a recurrent state; a cache of its own, an encoder-decoder, beam search, a static cache) or its family is declared
exact (DECLARED_EXACT), or after a probe of a few small forward passes, once per model, where
only running it tells (a forward that gives other logits over a cache, or ignores a 4-D mask).
"""

import weakref

import torch
import transformers
from transformers import GenerationConfig
from transformers.cache_utils import DynamicLayer

from lookahead.errors import UnsupportedGenerationError
from lookahead.index import as_id_set
from lookahead.integrations.hf import (
    TRANSFORMERS_VERSION, cache_inputs, cache_keyword, chain_positions, drop_cache_tail, gather_cache_tail, keep_rollback,
    new_cache, vocab_size,
)

ALTERNATIVE = "Call generate once per sequence with num_beams=1 and the default dynamic cache."
BATCH_ALTERNATIVE = ("For a batch, use our loop: lookahead.generate(model, input_ids, attention_mask=..., "
                     "drafter=LookupDrafter()), which verifies every row in one forward pass; or call generate once per sequence.")
PROBED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {("chain"/"tree"/"tree layers", training): reason or None}
PROBE_PREFIX = 6  # cached tokens before a probe's block
PROBE_BRANCH = 2  # tokens per branch of the probe's two-branch tree
# Families (config.model_type) whose forward is exact over a cache, for chains, and for trees with
# an attention that takes a 4-D mask (MASK_ATTENTION) over plain cache layers: declared, not
# probed. The probes cost a dozen small forward passes, a third of a short first call on a CPU
# (docs/benchmarks.md, the first call); tests/integrations/test_support.py checks each declared family's
# probes agree, and the sweep (docs/families.md) finds every one exact on every path.
DECLARED_EXACT = frozenset({
    "cohere", "gemma", "gemma2", "gemma3_text", "gpt2", "granite", "llama", "mistral", "mixtral", "olmo2", "phi3",
    "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "starcoder2",
})
MASK_ATTENTION = ("eager", "sdpa")  # attention implementations that take a 4-D mask and position ids as given


def unsupported_reason(model) -> str | None:
    """Why drafts cannot be verified on `model` (None: they can), from what the model declares and one probe.

    Declared, before any forward pass: before transformers 5.25, a recurrent / state-space /
    linear-attention state (its `_is_stateful`, its own refusal of assisted generation; from 5.25
    such layers roll back, hf.keep_rollback), a cache of the
    model's own (not a transformers Cache), a forward that takes no cache. Then, once per
    model, `chain_support`: a block of new tokens over a cache must give the logits of the
    whole sequence, and the cache must roll back (cost: 4 small forward passes).
    """
    name = type(model).__name__
    if getattr(model, "_is_stateful", False):
        return (f"{name} keeps a recurrent state (state-space, linear-attention or recurrent layers) that cannot be "
                "rolled back past rejected draft tokens (transformers refuses assisted generation on it too: a stateful model)")
    if not model._supports_default_dynamic_cache():
        return f"{name} keeps a cache of its own, not a transformers Cache that can drop rejected draft tokens"
    if cache_keyword(type(model)) is None:
        return f"{name}'s forward takes no KV cache, so each step would recompute the whole sequence"
    return chain_support(model)


def assisted_loop_unsound(model) -> str | None:
    """Where transformers' own assisted loop (the one assistant_model= runs) does not roll `model`'s cache back
    exactly, though our loop does: before transformers 5.24 (5.17 tested), layers that hold a linear-attention
    state and attention together (Inkling's); its prompt lookup gives other tokens there too. Reads the cache's
    layer classes, built from the config: no forward pass."""
    if TRANSFORMERS_VERSION >= (5, 24):
        return None
    kinds = sorted({type(layer).__name__ for layer in new_cache(model).layers if type(layer).__name__.startswith("LinearAttentionAnd")})
    if not kinds:
        return None
    return (f"transformers {transformers.__version__}'s assisted loop does not roll back {', '.join(kinds)} layers exactly "
            "(its prompt lookup differs too). Use lookahead.generate(model, input_ids, ...), or transformers >= 5.24")


def refuse_unsupported(model, entry: str) -> None:
    """Raises UnsupportedGenerationError naming why `entry` cannot verify drafts on `model` (unsupported_reason)."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise UnsupportedGenerationError(f"{entry} cannot verify drafts here: {reason}. Generate without the drafter.")


def chain_support(model) -> str | None:
    """None for a DECLARED_EXACT family; else a probe, once per model: a block of 2 tokens after a cache of 6,
    then 1 more after a rollback of one, against one forward over each whole sequence (no cache). None if
    the logits agree (probe_tolerance)."""
    if declared_exact(model, "chain"):
        return None
    return _probed(model, "chain", _probe_chain)


def declared_exact(model, kind: str) -> bool:
    """Whether `model`'s family is declared exact for `kind` ("chain", or "tree": with an attention in MASK_ATTENTION)."""
    config = model.config.get_text_config()
    if model.training or getattr(config, "model_type", None) not in DECLARED_EXACT:  # training: the probe says why not
        return False
    return kind == "chain" or getattr(config, "_attn_implementation", None) in MASK_ATTENTION


def tree_support(model) -> str | None:
    """Why a tree cannot be verified on `model` (None: it can), by one probe on the live model, once per model.

    A tree step verifies [last token, branch a, branch b] in one forward with a 4-D mask (each
    node sees the cache and its ancestors) at depth positions, then keeps one path by gathering
    cache entries; the probe checks both against plain forwards over [prefix, a] and [prefix, b],
    and the next token after the gathered path. Refused: caches whose layers are not plain
    full-attention layers (sliding windows, linear attention: their entries cannot be gathered
    per path), forwards that raise on a 4-D mask or ignore it.
    """
    reason = unsupported_reason(model)
    if reason is not None:
        return reason
    if declared_exact(model, "tree"):
        return _probed(model, "tree layers", lambda model: ungatherable_layers(model, new_cache(model)))  # a cache built once
    return _probed(model, "tree", _probe_tree)


def ungatherable_layers(model, cache, per: str = "tree path") -> str | None:
    """Why `cache`'s layers cannot be gathered `per` tree path or row (sliding windows, recurrent states), or None."""
    kinds = sorted({type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer})
    if not kinds:
        return None
    window = getattr(model.config.get_text_config(), "sliding_window", None)
    return (f"{type(model).__name__}'s cache has {', '.join(kinds)} layers"
            + (f" (sliding_window={window})" if window else "")
            + f", whose entries cannot be gathered per {per}")


def probe_tolerance(dtype: torch.dtype) -> float:
    """Largest |logit difference| / max |logit| a probe accepts: float32 kernels differ by ~1e-6, half types by ~1e-2."""
    return 1e-3 if dtype in (torch.float32, torch.float64) else 5e-2


def _probed(model, kind: str, probe) -> str | None:
    results = PROBED.setdefault(model, {})
    key = (kind, model.training)  # in training mode dropout makes any two forwards differ
    if key not in results:
        try:
            with torch.inference_mode():
                results[key] = probe(model)
        except Exception as error:  # noqa: BLE001 - the probe's finding: this model cannot verify that way
            results[key] = f"{type(model).__name__}'s forward raised {type(error).__name__} ({_first_line(error)})"
        if results[key] is not None and model.training:
            results[key] += " (the model is in training mode: call model.eval())"
    return results[key]


def _probe_ids(model, length: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(3, min(vocab_size(model), 1000), (1, length), generator=generator).to(model.device)


def _full_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """(length, vocab) float32 logits of one forward over the whole sequence, positions as plain generate gives them."""
    return model(input_ids=ids, use_cache=False, **chain_positions(model, 0, ids.shape[1], ids.device)).logits[0].float()


def _differs(model, got: torch.Tensor, expected: torch.Tensor, what: str) -> str | None:
    scale = float(expected.abs().max()) or 1.0
    error = float((got - expected).abs().max()) / scale
    if error <= probe_tolerance(model.dtype):
        return None
    return f"{type(model).__name__} gives other logits {what} than over the whole sequence (relative error {error:.1e})"


def _probe_chain(model) -> str | None:
    ids = _probe_ids(model, PROBE_PREFIX + 3)
    cache = new_cache(model)
    device = ids.device
    model(input_ids=ids[:, :PROBE_PREFIX], **cache_inputs(model, cache), **chain_positions(model, 0, PROBE_PREFIX, device))
    drop_cache_tail(cache, 0)  # a recording sliding-window layer cut back to its window, as after every step
    block = ids[:, PROBE_PREFIX : PROBE_PREFIX + 2]
    keep_rollback(cache, 2)
    got = model(input_ids=block, **cache_inputs(model, cache), **chain_positions(model, PROBE_PREFIX, 2, device)).logits[0].float()
    expected = _full_logits(model, ids[:, : PROBE_PREFIX + 2])[-2:]
    reason = _differs(model, got, expected, "for a block of new tokens after a cache")
    if reason is not None:
        return reason
    drop_cache_tail(cache, 1)  # the last block token rejected; the next block starts after the first
    start = PROBE_PREFIX + 1
    after = torch.cat([ids[:, :start], ids[:, -1:]], dim=1)
    got = model(input_ids=after[:, start:], **cache_inputs(model, cache), **chain_positions(model, start, 1, device)).logits[0].float()
    return _differs(model, got, _full_logits(model, after)[-1:], "after the cache dropped a rejected token")


def _probe_tree(model) -> str | None:
    branch = PROBE_BRANCH
    ids = _probe_ids(model, PROBE_PREFIX + 2 * branch + 1)
    prefix, a, b, bonus = (ids[:, :PROBE_PREFIX], ids[:, PROBE_PREFIX : PROBE_PREFIX + branch],
                           ids[:, PROBE_PREFIX + branch : PROBE_PREFIX + 2 * branch], ids[:, -1:])
    device = ids.device
    cache = new_cache(model)
    cached = PROBE_PREFIX - 1
    model(input_ids=prefix[:, :cached], **cache_inputs(model, cache), **chain_positions(model, 0, cached, device))
    drop_cache_tail(cache, 0)
    if (reason := ungatherable_layers(model, cache)) is not None:
        return reason
    # Block: the last prefix token, then branch a under it, then branch b under it.
    block = torch.cat([prefix[:, -1:], a, b], dim=1)
    n = block.shape[1]
    visible = torch.zeros((n, n), dtype=torch.bool)
    visible[:, 0] = True
    for start in (1, 1 + branch):
        for i in range(start, start + branch):
            visible[i, start : i + 1] = True
    dtype = model.dtype if model.dtype.is_floating_point else torch.float32
    mask = torch.zeros((1, 1, n, cached + n), dtype=dtype, device=device)
    mask[0, 0, :, cached:].masked_fill_(~visible.to(device), torch.finfo(dtype).min)
    depth = [0] + list(range(1, branch + 1)) * 2
    positions = torch.tensor([[cached + d for d in depth]], device=device)
    got = model(input_ids=block, **cache_inputs(model, cache), attention_mask=mask, position_ids=positions).logits[0].float()
    for start, tokens in ((1, a), (1 + branch, b)):
        expected = _full_logits(model, torch.cat([prefix, tokens], dim=1))[-branch - 1 :]
        rows = torch.cat([got[:1], got[start : start + branch]])
        reason = _differs(model, rows, expected, "for a tree verified with a 4-D mask (its attention does not take the mask "
                          "and position ids as given)")
        if reason is not None:
            return reason
    # keep the block's first entry and branch b, packed after the cache, as the loop keeps a tree path
    gather_cache_tail(cache, cached, torch.tensor([[0] + list(range(1 + branch, 1 + 2 * branch))]))
    start = PROBE_PREFIX + branch
    got = model(input_ids=bonus, **cache_inputs(model, cache), **chain_positions(model, start, 1, device)).logits[0].float()
    sequence = torch.cat([prefix, b, bonus], dim=1)
    return _differs(model, got, _full_logits(model, sequence)[-1:], "after a tree path was gathered into the cache")


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:160] if lines else ""


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
    if config is not None and config.use_cache is False:
        raise UnsupportedGenerationError("LookupDrafter needs the KV cache to drop rejected drafts; use_cache=False turns it off. "
                                         "Pass use_cache=True (or generate without assistant_model).")
    if target is not None:
        refuse_unsupported(target, "LookupDrafter (assistant_model=)")
        reason = assisted_loop_unsound(target)
        if reason is not None:
            raise UnsupportedGenerationError(f"LookupDrafter (assistant_model=) cannot verify drafts here: {reason}")


def check_candidate_generator_inputs(input_ids, model_kwargs: dict) -> None:
    if input_ids.shape[0] != 1:
        raise UnsupportedGenerationError(
            f"LookupDrafter drafts for one sequence, but the batch has {input_ids.shape[0]}: transformers' "
            f"assisted loop verifies batch size 1 only. {BATCH_ALTERNATIVE}"
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
