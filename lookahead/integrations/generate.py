"""`lookahead.generate`: our verification loop, one loop for one row and for batches, chains or trees.

One step, for the active rows at once: each row's request plans a draft (sized by
sizing.rules under the loop's costs), one forward pass verifies the (rows, width) block
(verify.build_block), the target walks each row's block (verify.walk), each row keeps
the walked path plus the model's own token, and the cache keeps exactly those
(row_cache.RowCache). Rows finish independently (EOS, max_new_tokens, stop strings, user
criteria) and leave the block at once.

Exactness. Greedy: every kept token is the model's argmax given exactly its row's tokens
before it, at their positions, read by the processors and stop checks through the row as
plain generate holds it; so the output equals plain (batched) greedy, rows that end early
padded with the pad id there. Sampling: every kept token is drawn from the model's
processed distribution given the tokens before it; a draft only decides whether that draw
is already computed, so for drafts that do not depend on the draw this is sampling from
the model.

A single unpadded row drafts with the caller's drafter (its index holds the request
afterwards, as after `assistant_model=`), streams, and can return scores, logits and the
cache; the rows of a batch draft chains or trees through one engine.Batch (BatchDrafts: every row in
one kernel call a step, as the vLLM proposer drafts; the drafter's options, memory, documents and
prediction table shared); each row is filed into memory as it finishes.
"""

import functools
import time
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StopStringCriteria

from lookahead.draft import DEFAULT_MAX_TREE_NODES, StepPlan
from lookahead.drafter import LookupDrafter
from lookahead.errors import UnsupportedGenerationError
from lookahead.integrations.batch_drafts import BatchDrafts
from lookahead.integrations.calibration import loop_costs
from lookahead.integrations.hf import (
    decoder_only_output, drop_cache_tail, new_cache, pad_token_id, row_processors,
    streamer_dropped_by_transformers, supports_logits_to_keep, vocab_size,
)
from lookahead.integrations.row_cache import RowCache
from lookahead.integrations.support import (
    check_generate, check_input_ids, eos_ids, refuse_unsupported, tree_support, ungatherable_layers,
)
from lookahead.integrations.verify import build_block, forward_block, greedy_choices, id_tensor, stop_index, top_ids, walk
from lookahead.request import Request


@dataclass
class Row:
    """One row of the call: its request, and the row as plain generate holds it."""

    request: Request | None  # one row's; a batch's: None (BatchDrafts drafts its rows)
    context: list[int]  # left padding, prompt, generated tokens
    pad: int  # left-padding tokens before the prompt
    processors: LogitsProcessorList  # the logits processors as they act on this row (hf.row_processors)


@dataclass(frozen=True)
class Options:
    """What a call asks of the loop, resolved once."""

    max_len: int  # a row's most tokens, prompt (and padding) included
    eos: frozenset[int]
    criteria: list  # stopping criteria other than EOS and length (checked per token)
    stop: StopStringCriteria | None
    do_sample: bool
    tree: bool | None  # None: the family takes trees; drafted where they cost what chains do (step_trees)
    max_tree_nodes: int
    record: bool  # scores or logits returned (one row)
    record_rejected: bool  # the prediction table learns at rejected draft nodes too, not only on the kept path


def generate(model, input_ids: torch.LongTensor, logits_processor: LogitsProcessorList | None = None,
             stopping_criteria: StoppingCriteriaList | None = None, generation_config: GenerationConfig | None = None, *,
             drafter: LookupDrafter | None = None, assistant: LookupDrafter | None = None, tree: bool | None = None,
             max_tree_nodes: int = DEFAULT_MAX_TREE_NODES, streamer=None, tokenizer=None, stop_strings: str | list[str] | None = None,
             record_rejected: bool = True, **kwargs):
    """Generates with drafts verified by `model`: one row or a batch, chains or trees per forward pass.

    Which entry point (outputs equal plain generate's in each):
    - most users: `model.generate(**inputs, assistant_model=LookupDrafter())`, transformers' own loop;
    - batches, and trees drafted from the model's own predictions (where verifying is nearly free:
      a GPU): this function, `lookahead.generate(model, input_ids, attention_mask=...,
      drafter=LookupDrafter(), max_new_tokens=64)`;
    - this loop through model.generate: `model.generate(**inputs, custom_generate=lookahead.CUSTOM_GENERATE,
      trust_remote_code=True, assistant=LookupDrafter())`.
    transformers prepares the logits processors, stopping criteria and config as for plain generate.
    After the call, `print(drafter.stats)` says what each source drafted and had kept, and
    `drafter.stats.render(tokenizer, html="drafts.html")` shows where each kept token came from.

    Args:
        model: a decoder-only transformers model.
        input_ids: (batch, prompt_len) token ids; a batch left-padded, with its attention_mask
            (kwargs), as transformers pads for generation.
        drafter: the LookupDrafter (a fresh one if not given). Its `cost_aware` decides
            whether drafts are cut to what verifying them pays (lookahead.sizing): a chain to
            its tokens that pay, a one-row tree to its likeliest nodes that do.
        assistant: the same, under the name transformers' custom_generate uses.
        tree: draft trees, or chains (default: trees where the family supports them and, with
            cost_aware, where a tree step costs no more than a chain step of its width, or than what
            its tree promises: learnt from the process's first tree steps, or timed ahead by
            lookahead.verify_costs).
        max_tree_nodes: node budget of a tree draft.
        streamer: receives the prompt, then each step's new tokens (transformers' protocol; one row).
        tokenizer: needed for `stop_strings`.
        stop_strings: stop at the token that completes one, as plain generate does
            (transformers' StopStringCriteria, checked after every token, even mid-block); needs tokenizer.
        record_rejected: the drafter's prediction table learns the model's top-k at every entry of
            a row's block from its last own token on: the kept path and the rejected draft nodes
            (each predicted given exactly its ancestors, so a true prediction after a context the
            model may write later). False: the kept path only (where the model's predictions off
            it are not a model's: the bench's forced model, lookahead.bench.traces).
        **kwargs: what model.generate takes (max_new_tokens, eos_token_id, do_sample,
            temperature, top_k, top_p, repetition_penalty, logits processors,
            return_dict_in_generate, output_scores, output_logits, attention_mask, ...).

    Returns:
        (batch, total_len) int64 sequences (a row that ended early padded with the pad id, as
        plain generate pads it), or, when return_dict_in_generate, a GenerateDecoderOnlyOutput
        with `sequences` and, for one unpadded row, `cache` (every token but the last, as plain
        generate leaves it) and, if asked for, `scores` (output_scores: the processed scores
        each new token was chosen from) and `logits` (output_logits: the raw logits at the
        position that produced it), one (1, vocab) float32 tensor per new token. The
        drafter's `stats` describe the call (for a batch, every row's steps, row after row).

    Raises:
        UnsupportedGenerationError: padding other than left padding, beam search,
            encoder-decoder models, static caches, tree=True for a family without tree
            support, output_attentions or output_hidden_states with return_dict_in_generate;
            for a batch, a streamer, output_scores or output_logits.
    """
    drafter = _the_drafter(drafter, assistant, kwargs)
    check_input_ids(input_ids, model)
    if generation_config is None:  # a direct call
        loop = dict(drafter=drafter, tree=tree, max_tree_nodes=max_tree_nodes, streamer=streamer, tokenizer=tokenizer, stop_strings=stop_strings,
                    record_rejected=record_rejected)
        return through_transformers(model, input_ids, loop, logits_processor=logits_processor, stopping_criteria=stopping_criteria, **kwargs)
    prompt_streamed = False
    if streamer is None:  # through custom_generate transformers drops it, having put the prompt already
        streamer = streamer_dropped_by_transformers()
        prompt_streamed = streamer is not None
    check_generate(model, input_ids, generation_config, kwargs)
    refuse_unsupported(model, "lookahead.generate")
    mask = kwargs.get("attention_mask")
    batch = input_ids.shape[0] > 1 or (mask is not None and not bool(mask.all()))
    options = _options(model, input_ids, generation_config, stopping_criteria, tree, max_tree_nodes, tokenizer, stop_strings,
                       record_rejected)
    if batch:
        _check_batch(generation_config, streamer, options)
    pads = (mask == 0).sum(dim=1).tolist() if batch and mask is not None else [0] * input_ids.shape[0]
    processors = logits_processor if logits_processor is not None else LogitsProcessorList()
    with drafter._exclusive():  # the whole call: another thread's request on it raises DrafterInUseError
        drafter.eos_token_ids = drafter.eos_option | options.eos  # drafting past an EOS cannot pay
        drafter.vocab_size = vocab_size(model)  # drafts never hold an id the model cannot take
        costs = loop_costs(model) if drafter.cost_aware else None
        rows = _rows(drafter, input_ids.tolist(), pads, processors, batch=batch)
        # a batch's rows draft through one engine, all rows in one call a step (BatchDrafts)
        drafts = BatchDrafts(drafter, [row.context[row.pad :] for row in rows], options.max_len) if batch else None
        if streamer is not None and not prompt_streamed:
            streamer.put(input_ids.cpu())
        try:
            with torch.inference_mode():
                record, cache = _loop(model, rows, options, costs, streamer, drafts=drafts)
        finally:
            if drafts is not None:
                drafts.close()  # every ended row filed into memory
        if streamer is not None:
            streamer.end()
        if drafts is not None:
            drafter.stats = drafts.call_stats()
    return _output(rows, generation_config, record, cache, batch=batch, device=input_ids.device)


def through_transformers(model, input_ids, loop: dict, **kwargs):
    """Our loop on `input_ids` with `loop`'s options (the drafter, tree, max_tree_nodes, streamer,
    tokenizer, stop_strings, record_rejected), everything else (kwargs: a generation_config too) prepared by
    transformers' generate exactly as for plain generate, which then calls us back. It drops
    `streamer` and `tokenizer` on that path, and refuses stop_strings without a tokenizer, so those
    travel bound to the callback. The class's generate, not the instance's: a model loaded with a
    custom_generate folder (lookahead.integrations.hub) has ours there."""
    return type(model).generate(model, input_ids, custom_generate=functools.partial(generate, **loop), **kwargs)


def _loop(model, rows: list[Row], options: Options, costs, streamer, *, drafts: BatchDrafts | None) -> tuple[list, RowCache]:
    """Steps until every row has ended; returns (per new token of a single row, (processed scores, raw logits)), and the cache.
    `drafts`: a batch's drafting (else the one row's request drafts)."""
    cache = RowCache(new_cache(model), len(rows))
    if len(rows) > 1 and (reason := ungatherable_layers(model, cache.cache, "row")) is not None:
        raise UnsupportedGenerationError(f"{reason}: generate one row at a time")
    logits_to_keep = supports_logits_to_keep(model)
    device = model.device  # read once: transformers finds it by walking the parameters
    dtype = model.dtype if model.dtype.is_floating_point else torch.float32
    record = []
    active, first = rows, True
    while active:
        step_start = time.perf_counter()
        trees = step_trees(options.tree, costs, len(active))  # the call's steps draft trees now (the prefill verifies a chain)
        if drafts is None:  # one row
            plan = _plan(active[0], costs, options, tree=trees and not first)
            step_drafts, gain = [plan.draft], plan.gain
        else:
            gain = 1.0
            rooms = [options.max_len - len(row.context) - 1 for row in active]  # the step's own token takes the last place
            step_drafts = drafts.plan(rooms, None if costs is None else costs.at(len(active)), first=first,
                                      tree=trees and not first, max_tree_nodes=options.max_tree_nodes)
        start = time.perf_counter()
        u = len(active[0].context) if first else 1  # uncached tokens per row: the padded prompt, or the last own token
        block = build_block([row.context for row in active], step_drafts, [row.pad if first else 0 for row in active],
                            cache, uncached=u, dtype=dtype)
        logits, first_logit = forward_block(model, block, cache, logits_to_keep, device)
        step_record = [] if options.record else None  # (one row) per token the walk returns
        argmax = greedy_choices(logits, active[0].processors, options.do_sample, step_record)  # rows share processors' kinds
        logits = logits if argmax is not None else logits.float()  # processors and scores read float32
        walks = [walk(row.processors, logits[r] if argmax is None else None, first_logit, block.ids[r], block.parents[r], u, row.context,
                      options.do_sample, step_record, None if argmax is None else argmax[r]) for r, row in enumerate(active)]
        # The model's top-k only where the call's drafts read the table (a plain chain takes none of it, so chains
        # alone, tree=False or tree=None decided against trees, skip it), and only at the entries the table learns
        # from: each row's block from its last own token (u - 1) on, or its kept path alone (record_rejected=False).
        learnt = None  # per row, the block entries the table learns from
        drafter = active[0].request.drafter if drafts is None else drafts.drafter
        if drafter._reads_predictions(tree=trees):
            table = drafter.predictions
            learnt = [range(u - 1, len(block.ids[r])) if options.record_rejected else path for r, (path, _) in enumerate(walks)]
            top = top_ids(logits, [range(e.start - first_logit, e.stop - first_logit) if isinstance(e, range)
                                   else [i - first_logit for i in e] for e in learnt], table.k)
        window = time.perf_counter() - start  # the forward and the block's work around it; the walk's choices synced the device
        going, kept_blocks, inputs = [], [], []
        for r, (row, (path, choice)) in enumerate(zip(active, walks)):
            kept = [block.ids[r][i] for i in path[1:]]
            new = kept + [choice]
            stop_at = stop_index(row.context, new, options.max_len, options.eos, options.criteria, options.stop)
            new = new if stop_at is None else new[:stop_at]
            if step_record is not None:
                record += step_record[: len(new)]
            if streamer is not None:
                streamer.put(torch.tensor(new))
            row.context += new
            row_inputs = None if learnt is None else [block.ids[r][i] for i in learnt[r]]
            if drafts is not None:
                drafts.verified(r, new, len(kept))
                inputs.append(row_inputs)
            else:  # the last block too: the drafter indexes the whole output
                row.request.verified(new, accepted=len(kept), predicted=None if learnt is None else (row_inputs, top[r]))
            if stop_at is not None:
                if drafts is not None:
                    drafts.finish(r)  # a batch's row: its prompt and whole output go into the shared memory
                continue
            going.append(r)
            kept_blocks.append(list(range(block.skips[r], u)) + path[1:])
        if going:
            cache.keep(going, kept_blocks, block.tokens.shape[1])
        if costs is not None:  # the step's real shape, and the host's work outside the window (planning, bookkeeping)
            if first:
                costs.observe_prefill(len(active), block.tokens.shape[1], window)
            else:
                costs.observe(len(active), block.tokens.shape[1], window, tree=block.is_tree,
                              host=time.perf_counter() - step_start - window, gain=gain)
        if drafts is not None:
            if learnt is not None:
                drafts.learnt(inputs, top)
            drafts.keep(going)
        active, first = [active[r] for r in going], False
    return record, cache


def _plan(row: Row, costs, options: Options, *, tree: bool) -> StepPlan:
    """The one row's draft for one step: its chain that pays, or its likeliest tree nodes that do (Request.plan;
    unsized: whole)."""
    room = options.max_len - len(row.context) - 1  # the step's own token takes the last place
    cost = None if costs is None else costs.at(1)
    promise = costs is not None and costs.trees() is None  # the tree trial weighs what its plans promise
    return row.request.plan(room, cost, tree=tree, max_tree_nodes=options.max_tree_nodes, promise=promise)


def _rows(drafter: LookupDrafter, prompts: list[list[int]], pads: list[int], processors, *, batch: bool) -> list[Row]:
    """The call's rows: one unpadded row drafts with `drafter` itself; a batch's rows through BatchDrafts."""
    if not batch:
        drafter.reset(prompts[0])
        return [Row(Request(drafter, sized=drafter.cost_aware), list(prompts[0]), 0, row_processors(processors, 0, 1))]
    drafter.finish()  # files the drafter's last request into memory, where the rows copy from it
    return [Row(None, list(prompt), pad, row_processors(processors, i, len(prompts))) for i, (prompt, pad) in enumerate(zip(prompts, pads))]


def _output(rows: list[Row], config: GenerationConfig, record: list, cache: RowCache, *, batch: bool, device):
    if batch:
        pad = pad_token_id(config)
        longest = max(len(row.context) for row in rows)
        sequences = id_tensor([row.context + [pad] * (longest - len(row.context)) for row in rows]).to(device)
        return decoder_only_output(sequences=sequences) if config.return_dict_in_generate else sequences
    sequence = rows[0].context
    sequences = id_tensor([sequence]).to(device)  # int64 whatever came in, as plain generate
    if not config.return_dict_in_generate:
        return sequences
    with torch.inference_mode():  # the loop's tensors: a recurrent layer's crop updates them in place
        drop_cache_tail(cache.cache, cache.cache.get_seq_length() - (len(sequence) - 1))  # a stop inside the kept block
    return decoder_only_output(
        sequences=sequences, scores=tuple(s for s, _ in record) if config.output_scores else None,
        logits=tuple(raw for _, raw in record) if config.output_logits else None, cache=cache.cache,
    )


def _the_drafter(drafter, assistant, kwargs) -> LookupDrafter:
    if "cost_aware" in kwargs:
        raise TypeError("cost_aware is the drafter's option: LookupDrafter(cost_aware=False)")
    if drafter is not None and assistant is not None:
        raise TypeError("pass the drafter once: drafter= (or assistant=, its name under custom_generate)")
    drafter = drafter if drafter is not None else assistant if assistant is not None else LookupDrafter()
    if not isinstance(drafter, LookupDrafter):
        raise TypeError(f"drafter must be a lookahead.LookupDrafter instance, got {drafter!r}")
    return drafter


def _options(model, input_ids, config: GenerationConfig, stopping_criteria, tree, max_tree_nodes: int, tokenizer, stop_strings,
             record_rejected: bool) -> Options:
    if tree is None:
        tree = None if tree_support(model) is None else False
    elif tree and (reason := tree_support(model)) is not None:
        raise UnsupportedGenerationError(f"tree drafts are not supported here: {reason}. Use tree=False.")
    stop_strings = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings or [])
    if stop_strings and tokenizer is None:
        raise ValueError(
            "stop_strings needs tokenizer= to decode the generated tokens. Through model.generate(custom_generate=...) "
            "transformers does not forward tokenizer=; bind it: custom_generate=functools.partial(lookahead.generate, tokenizer=tokenizer)"
        )
    max_len = input_ids.shape[1] + config.max_new_tokens if config.max_new_tokens is not None else config.max_length
    return Options(
        max_len=max_len, eos=eos_ids(config), do_sample=bool(config.do_sample), tree=tree, max_tree_nodes=max_tree_nodes,
        # EOS and length are checked per token in the loop; other criteria (stop strings, user ones) run as given.
        criteria=[c for c in (stopping_criteria or []) if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))],
        stop=StopStringCriteria(tokenizer, stop_strings) if stop_strings else None,
        record=bool(config.return_dict_in_generate and (config.output_scores or config.output_logits)),
        record_rejected=bool(record_rejected),
    )


def step_trees(tree: bool | None, costs, rows: int) -> bool:
    """Whether a step (not the prefill) drafts a tree. tree=None (the family takes trees): unsized,
    trees; sized, where our tree steps, the host's work included, cost what a chain step of their
    width does within the noise, or within what their trees promise (costs.trees()), and, until that
    is known, one-row steps try trees once a chain step's host work is timed (costs.tree_trial(): the process's first few chain,
    then tree steps are what decides; a sized tree costs what its chain does under the curve)."""
    if tree is not None:
        return tree
    if costs is None:
        return True
    known = costs.trees()
    return rows == 1 and costs.tree_trial() if known is None else known


def _check_batch(config: GenerationConfig, streamer, options: Options) -> None:
    if streamer is not None:
        raise UnsupportedGenerationError("streaming a batch is not supported (transformers' streamers take one row): generate without streamer=")
    if options.record:
        raise UnsupportedGenerationError(
            "scores and logits are returned for one row (batch size 1, unpadded): a batch's finished rows stop "
            "computing, so there are no scores to match plain generate's for them"
        )
    if pad_token_id(config) is None and (options.eos or options.stop is not None or options.criteria):
        raise ValueError("a batch whose rows can end early needs pad_token_id (plain generate pads finished rows with it)")
