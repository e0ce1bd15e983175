"""`lookahead.generate`: our own verification loop; a whole draft tree per forward pass.

One step: the block [uncached tokens..., draft nodes...] runs through the model with a 4D
mask in which each token sees the cache, the uncached tokens before it and, for a draft
node, its own ancestors, at position cached + depth. (Uncached: the prompt on the first
step, so the prefill verifies a first draft; afterwards the last step's own token.)
Starting at the last uncached token, the target's choice at each node (argmax, or a sample
from the processed distribution) is looked up among the node's children: found, descend;
not found, it is the step's own token. The KV cache keeps the walked path only.

Exactness. Greedy: every kept token is the model's argmax given exactly the tokens before
it, so the output equals plain greedy decoding. Sampling: every kept token is drawn from
the model's processed distribution given the tokens before it; a draft only decides
whether that draw is already computed, so for drafts that do not depend on the draw this
is sampling from the model.
"""

import functools
import time

import numpy as np
import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StopStringCriteria
from transformers.generation.utils import GenerateDecoderOnlyOutput

from lookahead.draft import Draft
from lookahead.drafter import DEFAULT_MAX_TREE_NODES, LookupDrafter
from lookahead.errors import UnsupportedGenerationError
from lookahead.integrations.calibration import step_costs, tree_cost_16
from lookahead.integrations.transformers import (
    drop_cache_tail, first_stop, keep_cache_positions, new_cache, streamer_dropped_by_transformers, supports_logits_to_keep, vocab_size,
)
from lookahead.sizing import DraftSizer, plan_step

# Families whose attention applies a custom 4D mask and whose cache layers can be gathered.
TREE_MODEL_TYPES = {"llama", "qwen2", "mistral", "phi3"}  # each tested for exact tree verification
# tree=None drafts trees where a 16-node tree, verified with its explicit mask, costs at most
# this many times one token (calibration.tree_cost_16: the mask path measured, not the chain's).
# Modelled on the dev traces, sized trees beat sized chains by 3-6% where 16 tokens cost 1.24x
# one and by 13-23% where verification is free, and tie where 16 tokens cost 2.35x.
TREE_MAX_COST_16 = 1.5


def generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    generation_config: GenerationConfig | None = None,
    *,
    drafter: LookupDrafter | None = None,
    assistant: LookupDrafter | None = None,
    tree: bool | None = None,
    max_tree_nodes: int = DEFAULT_MAX_TREE_NODES,
    streamer=None,
    tokenizer=None,
    stop_strings: str | list[str] | None = None,
    **kwargs,
):
    """Generates with drafts verified by `model`, chains or whole trees per forward pass.

    Call it directly, `lookahead.generate(model, input_ids, drafter=LookupDrafter(), max_new_tokens=64)`,
    or through transformers: `model.generate(**inputs, custom_generate=lookahead.generate,
    assistant=LookupDrafter())`. Either way transformers prepares the logits processors,
    stopping criteria and config as for plain generate. On the custom_generate path
    transformers does not forward `streamer` (we read it from its frame) or `tokenizer`:
    for stop_strings there, bind it, `custom_generate=functools.partial(lookahead.generate,
    tokenizer=tokenizer)`.

    Args:
        model: a decoder-only transformers model.
        input_ids: (batch, prompt_len) token ids; a batch left-padded, with its attention_mask
            (kwargs), as transformers pads for generation. Batch size 1 without padding runs
            this module's one-row loop; anything else lookahead.integrations.batch.
        drafter: the LookupDrafter (a fresh one if not given). Its `cost_aware` decides
            whether drafts are cut to what verifying them pays (lookahead.sizing), and trees
            to the nodes that cost no more than that chain.
        assistant: the same, under the name transformers' custom_generate convention uses
            (`model.generate(custom_generate=lookahead.generate, assistant=...)`).
        tree: draft trees, or chains (default: trees where the family supports them and
            the calibration finds verification cheap: 16 tokens for at most TREE_MAX_COST_16
            times one).
        max_tree_nodes: node budget of a tree draft.
        streamer: receives the prompt, then each step's new tokens (transformers' protocol).
        tokenizer: needed for `stop_strings`.
        stop_strings: stop at the token that completes one, as plain generate does
            (transformers' StopStringCriteria, checked after every token, even mid-block); needs tokenizer.
        **kwargs: what model.generate takes (max_new_tokens, eos_token_id, do_sample,
            temperature, top_k, top_p, repetition_penalty, logits processors,
            return_dict_in_generate, output_scores, output_logits, attention_mask, ...).

    Returns:
        (batch, total_len) sequences (a row that ended early padded with the pad id, as
        plain generate pads it), or, when return_dict_in_generate, a
        GenerateDecoderOnlyOutput with `sequences`, `cache` (every token but the last, as
        plain generate leaves it) and, if asked for, `scores` (output_scores: the processed
        scores each new token was chosen from) and `logits` (output_logits: the raw logits
        at the position that produced it), one (1, vocab) float32 tensor per new token
        as plain generate returns them (for a batch: `sequences` only). The drafter's `stats`
        describe the call (for a batch, every row's steps).

    Raises:
        UnsupportedGenerationError: padding other than left padding, beam search,
            encoder-decoder models, static caches, tree=True for a family without tree
            support, output_attentions or output_hidden_states with return_dict_in_generate;
            for a batch, a streamer, output_scores or output_logits.
    """
    if "cost_aware" in kwargs:
        raise TypeError("cost_aware is the drafter's option: LookupDrafter(cost_aware=False)")
    if drafter is not None and assistant is not None:
        raise TypeError("pass the drafter once: drafter= (or assistant=, its name under custom_generate)")
    drafter = drafter if drafter is not None else assistant if assistant is not None else LookupDrafter()
    if not isinstance(drafter, LookupDrafter):
        raise TypeError(f"drafter must be a lookahead.LookupDrafter instance, got {drafter!r}")
    _check_input_ids(input_ids, model)
    prompt_streamed = False
    if streamer is None and generation_config is not None:
        streamer = streamer_dropped_by_transformers()
        prompt_streamed = streamer is not None  # transformers' generate put the prompt already
    if generation_config is None:
        # A direct call: let transformers prepare processors, stopping criteria and the config
        # exactly as for plain generate, then call us back. It drops `streamer` and
        # `tokenizer` on that path, and refuses stop_strings without a tokenizer, so those
        # travel bound to the callback.
        callback = functools.partial(
            generate, drafter=drafter, tree=tree, max_tree_nodes=max_tree_nodes, streamer=streamer,
            tokenizer=tokenizer, stop_strings=stop_strings,
        )
        return model.generate(
            input_ids, logits_processor=logits_processor, stopping_criteria=stopping_criteria, custom_generate=callback, **kwargs
        )
    config = generation_config
    processors = logits_processor if logits_processor is not None else LogitsProcessorList()
    # EOS and length are checked per token below; other criteria (stop strings, user ones) run as given.
    criteria = [c for c in (stopping_criteria or []) if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
    _check(model, input_ids, config, kwargs)
    if tree is None:
        use_tree = _tree_supported(model) and tree_cost_16(model) <= TREE_MAX_COST_16
    else:
        use_tree = tree
    if use_tree and not _tree_supported(model):
        raise UnsupportedGenerationError(f"tree drafts are not supported here: {_tree_unsupported_reason(model)}. Use tree=False.")

    prompt_len = input_ids.shape[1]
    max_len = prompt_len + config.max_new_tokens if config.max_new_tokens is not None else config.max_length
    eos = _eos_set(config)
    stop_strings = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings or [])
    if stop_strings and tokenizer is None:
        raise ValueError(
            "stop_strings needs tokenizer= to decode the generated tokens. Through model.generate(custom_generate=...) "
            "transformers does not forward tokenizer=; bind it: custom_generate=functools.partial(lookahead.generate, tokenizer=tokenizer)"
        )
    stop = StopStringCriteria(tokenizer, stop_strings) if stop_strings else None
    do_sample = bool(config.do_sample)
    mask = kwargs.get("attention_mask")
    if input_ids.shape[0] > 1 or (mask is not None and not bool(mask.all())):
        # Several rows, or one left-padded: the batched loop (this module's helpers; imported here, it imports us).
        from lookahead.integrations.batch import generate_batch

        return generate_batch(model, input_ids, mask, drafter, config, processors, criteria, use_tree=use_tree,
                              max_tree_nodes=max_tree_nodes, max_len=max_len, eos=eos, stop=stop, streamer=streamer)
    record = config.return_dict_in_generate and (config.output_scores or config.output_logits)
    scores, raw_logits = [], []  # per new token, (1, vocab) float32: what plain generate returns

    sequence = input_ids[0].tolist()
    with drafter.exclusive():  # the whole call: another thread's request on it raises DrafterInUseError
        drafter.eos_token_ids = drafter.eos_option | eos  # drafting past an EOS cannot pay
        drafter.vocab_size = vocab_size(model)  # drafts never hold an id the model cannot take
        drafter.reset(sequence)
        if streamer is not None and not prompt_streamed:
            streamer.put(input_ids.cpu())
        # Sized by what steps of this request cost: seeded by the calibration, then the loop's own times.
        sizer = DraftSizer(step_costs(model), drafter.max_ngram) if drafter.cost_aware else None
        logits_to_keep = supports_logits_to_keep(model)
        cache = new_cache(model)
        with torch.inference_mode():
            while True:
                room = max_len - len(sequence) - 1  # draft tokens that fit: the step's own token takes the last place
                # The first step also prefills the prompt: a tree there would need an explicit mask
                # over the whole prompt (a slower attention path), so it verifies a chain.
                tree_step = use_tree and len(sequence) > prompt_len
                chain, draft, size = plan_step(drafter, sizer, room, tree=tree_step, max_tree_nodes=max_tree_nodes)
                rows = [] if record else None
                start = time.perf_counter()
                kept, choice = _verify(model, cache, sequence, draft, processors, do_sample, logits_to_keep, rows)
                if sizer is not None and len(sequence) > prompt_len and not tree_step:
                    sizer.timed(1 + len(draft), time.perf_counter() - start)  # a chain step (the choice synced the device)
                if sizer is not None and len(chain):
                    sizer.observed(chain.match_len, chain.token_ids.tolist(), size, kept + [choice], len(sequence))
                drafter.stats.record(len(draft), len(kept))
                new = kept + [choice]
                stop_at = _stop_index(sequence, new, max_len, eos, criteria, stop)
                new = new if stop_at is None else new[:stop_at]
                if record:
                    scores += [processed for processed, _ in rows[: len(new)]]
                    raw_logits += [raw for _, raw in rows[: len(new)]]
                _emit(streamer, new)
                sequence += new
                drafter.extend(new)  # the last block too: the next request's reset files the whole output into memory
                if stop_at is not None:
                    break
                if sizer is not None:
                    sizer.settle(sequence)
        if streamer is not None:
            streamer.end()
    sequences = torch.tensor([sequence], dtype=torch.long, device=input_ids.device)  # int64 whatever came in, as plain generate
    if config.return_dict_in_generate:
        drop_cache_tail(cache, cache.get_seq_length() - (len(sequence) - 1))  # a stop inside the kept block
        return GenerateDecoderOnlyOutput(
            sequences=sequences, scores=tuple(scores) if config.output_scores else None,
            logits=tuple(raw_logits) if config.output_logits else None, cache=cache,
        )
    return sequences


def _verify(model, cache, sequence: list[int], draft: Draft, processors, do_sample: bool, logits_to_keep: bool,
            rows: list | None = None):
    """One forward pass over the uncached tokens plus the draft; returns (kept draft tokens, model's next token).

    The tokens of `sequence` past the cache (the prompt on the first step, else the last
    step's own token) form a causal chain; the draft's roots hang from its last token.
    Afterwards the cache holds the sequence and the kept draft tokens. With `rows`, appends
    (processed scores, raw logits), each (1, vocab) float32, for each returned token.
    """
    cached = cache.get_seq_length()
    u = len(sequence) - cached  # uncached tokens, >= 1
    n = len(draft)
    tokens = sequence[cached:] + draft.token_ids.tolist()
    parents = list(range(-1, u - 1)) + [u - 1 if p < 0 else u + p for p in draft.parents.tolist()]
    depth = list(range(u)) + [0] * n
    for i in range(u, u + n):
        depth[i] = depth[parents[i]] + 1
    device = model.device
    block = torch.tensor([tokens], device=device)
    is_chain = all(parents[i] == i - 1 for i in range(1, u + n))
    # Logits only where the walk reads them: the last uncached token and the draft nodes
    # (a prompt's logits over a large vocabulary would cost more than the forward pass).
    keep = {"logits_to_keep": n + 1} if logits_to_keep else {}
    first = u - 1 if keep else 0  # block index of logits row 0
    if is_chain:
        out = model(input_ids=block, cache=cache, use_cache=True, **keep)
    else:
        visible = _tree_visibility(u, draft.parents)
        dtype = model.dtype if model.dtype.is_floating_point else torch.float32
        mask = torch.zeros((1, 1, u + n, cached + u + n), dtype=dtype, device=device)
        mask[0, 0, :, cached:].masked_fill_(~visible.to(device), torch.finfo(dtype).min)
        positions = torch.tensor([[cached + d for d in depth]], device=device)
        out = model(input_ids=block, cache=cache, use_cache=True, attention_mask=mask, position_ids=positions, **keep)
    logits = out.logits[0].float()
    path, choice = _walk(processors, logits, first, tokens, parents, u, sequence, do_sample, rows)
    _keep_in_cache(cache, cached, list(range(u)) + path[1:], u + n, is_chain)
    return [tokens[i] for i in path[1:]], choice


def _walk(processors, logits: torch.Tensor, first: int, tokens: list[int], parents: list[int], u: int, sequence: list[int],
          do_sample: bool, rows: list | None = None) -> tuple[list[int], int]:
    """The target's walk down a verified block: (block indices of the path kept, from u - 1; the model's own token).

    tokens/parents: the block, u uncached tokens then draft nodes (parents[i] < i); logits:
    (block positions from `first` on, vocab). sequence: what the processors read before
    the block's path (its uncached tokens included). With `rows`, appends (processed
    scores, raw logits), each (1, vocab) float32, per token returned.
    """
    children: dict[tuple[int, int], int] = {(parents[i], tokens[i]): i for i in range(u, len(tokens))}
    path = [u - 1]
    device = logits.device
    while True:
        node = path[-1]
        context = sequence + [tokens[i] for i in path[1:]]
        choice, processed = _choose(processors, torch.tensor([context], device=device), logits[node - first], do_sample)
        if rows is not None:
            rows.append((processed, logits[node - first][None].clone()))
        child = children.get((node, choice))
        if child is None:
            return path, choice
        path.append(child)


def _tree_visibility(u: int, parents: np.ndarray) -> torch.Tensor:
    """(u + n, u + n) bools: block token j is token i or one of its ancestors.

    The u uncached tokens form a causal chain and every draft node (parents[i] < i, -1:
    the last uncached token) descends from its end, so only the draft block needs ancestor
    sets: O((u + n)^2) bits but O(n^2) Python, whatever the prompt length.
    """
    n = parents.shape[0]
    ancestors = np.zeros((n, n), dtype=bool)
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            ancestors[i] = ancestors[p]
        ancestors[i, i] = True
    visible = torch.ones((u + n, u + n), dtype=torch.bool).tril_()
    visible[u:, u:] = torch.from_numpy(ancestors)
    return visible


def _keep_in_cache(cache, cached: int, keep: list[int], block_len: int, is_chain: bool) -> None:
    """Keeps the block entries `keep` (ascending block indices) after the `cached` ones.

    For a chain the kept entries are a prefix of the block (crop); for a tree they are gathered.
    """
    if is_chain:
        drop_cache_tail(cache, block_len - len(keep))
        return
    keep_cache_positions(cache, torch.tensor(list(range(cached)) + [cached + b for b in keep]))


def _choose(processors, context: torch.LongTensor, logits: torch.Tensor, do_sample: bool) -> tuple[int, torch.Tensor]:
    """(the token chosen, the (1, vocab) processed scores it was chosen from)."""
    scores = logits[None].clone()
    if len(processors):
        scores = processors(context, scores)
    if do_sample:
        return int(torch.multinomial(torch.softmax(scores[0], dim=-1), 1)), scores
    return int(scores[0].argmax()), scores


def _stop_index(sequence, new, max_len, eos, criteria, stop):
    """How many of `new` to keep if generation stops among them (None: it goes on).

    `stop` (a StopStringCriteria) is checked after every token of `new`, as plain generate
    checks it, in one batched call on the last tokens it reads (first_stop).
    """
    completes = len(new) if stop is None else first_stop([stop], torch.tensor(sequence[-stop.maximum_token_len :]), np.asarray(new))
    for i, token in enumerate(new):
        length = len(sequence) + i + 1
        if token in eos or length >= max_len or i == completes:
            return i + 1
        if criteria:
            ids = torch.tensor([sequence + new[: i + 1]])
            if any(bool(c(ids, None).any()) for c in criteria):
                return i + 1
    return None


def _emit(streamer, tokens: list[int]) -> None:
    if streamer is not None and tokens:
        streamer.put(torch.tensor(tokens))


def _eos_set(config: GenerationConfig) -> set[int]:
    eos = config.eos_token_id
    if eos is None:
        return set()
    return {int(eos)} if isinstance(eos, int) else {int(t) for t in eos}


def _check_input_ids(input_ids, model) -> None:
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


def _check(model, input_ids, config: GenerationConfig, kwargs: dict) -> None:
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
    if config.cache_implementation not in (None, "dynamic"):
        raise UnsupportedGenerationError(f"lookahead.generate keeps its own dynamic cache; cache_implementation='{config.cache_implementation}' is not supported")
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if cache is not None and "Static" in type(cache).__name__:
        raise UnsupportedGenerationError(f"lookahead.generate keeps its own dynamic cache; a {type(cache).__name__} is not supported")
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


def _tree_supported(model) -> bool:
    return _tree_unsupported_reason(model) is None


def _tree_unsupported_reason(model) -> str | None:
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
