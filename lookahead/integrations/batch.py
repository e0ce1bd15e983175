"""Batches in `lookahead.generate`: B left-padded rows verified as one (B, width) block per step.

Per row: a LookupDrafter of its own (`LookupDrafter.sibling`: the caller's options, its
memory and documents shared), a DraftSizer that learns the row's keep chance, and the row
as plain batched generate holds it (left padding, prompt, generated tokens), which the
logits processors and stop checks read.

Cache layout: rows of one length S, each row's real tokens anywhere in it, the other slots
(left padding, a row's share of the fill, a tree's dropped branches) marked unreal and never
attended to. A step's block holds, per row, its uncached tokens (the padded prompt on the
first step, else its last own token) and its draft, right-padded to the step's width W; a
2-D mask (chains: transformers adds the causal part) or a 4-D one (trees: each node sees
the real cache, the uncached tokens and its own ancestors) hides what is not real, and each
token's position id counts the real tokens before it in its row. After the walk only the
block's tail moves: each row's kept entries are packed to its front (a gather over the last
W slots) and the cache is cut after the longest; the whole cache is gathered back to
left-padded rows without holes only when rows leave (they stop costing compute at once) or
holes pass a quarter of it.

Exactness: each row's tokens are chosen from logits computed over exactly its own real
tokens at their own positions, and read by the processors and stop checks through the row
plain generate would hold, so greedy output equals plain batched greedy; rows that finish
early are padded with the pad id there. Rejected draft tokens and the fill never enter the
kept cache.
"""

import time
from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from lookahead.draft import Draft, DraftStats
from lookahead.drafter import LookupDrafter
from lookahead.errors import UnsupportedGenerationError
from lookahead.integrations.calibration import fixed_cost_tokens
from lookahead.integrations.engine import _stop_index, _tree_visibility, _walk
from lookahead.integrations.transformers import (
    cache_rows_gatherable, drop_cache_tail, gather_cache_rows, gather_cache_tail, new_cache, pad_token_id, row_processors,
    supports_logits_to_keep, vocab_size,
)
from lookahead.sizing import DraftSizer, StepCostFit, cost_curve, static_batch_draft_sizes

_UNUSED_COSTS = cost_curve((1,) * 7)  # a row's sizer only learns keep chances; the batch's StepCostFit prices steps


@dataclass
class _Row:
    drafter: LookupDrafter
    sizer: DraftSizer | None
    context: list[int]  # the row as plain generate holds it: left padding, prompt, generated tokens
    pad: int  # left-padding tokens before the prompt
    stats: DraftStats  # the row's request's stats (the drafter's own, until its reset files the request)
    processors: LogitsProcessorList  # the logits processors as they act on this row (row_processors)
    cached: int = 0  # the row's real tokens in the cache


@dataclass
class _Plan:
    chain: Draft  # what the sizer learns from (empty without a sizer on tree steps)
    draft: Draft  # what the step verifies
    size: int  # tokens of the chain offered


def generate_batch(model, input_ids, attention_mask, drafter: LookupDrafter, config, processors, criteria, *,
                   use_tree: bool, max_tree_nodes: int, max_len: int, eos: set[int], stop, streamer):
    """`lookahead.generate` for (B, L) left-padded input_ids; see engine.generate for the arguments.

    Returns (B, L + the most tokens a row generated) int64, a row that ended earlier padded
    with the pad id, as plain batched generate returns it (or a GenerateDecoderOnlyOutput
    with `sequences` only). The drafter's stats hold every row's steps, row after row.
    """
    _check_batch(model, config, streamer, eos, stop, criteria)
    batch = input_ids.shape[0]
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    pads = (mask == 0).sum(dim=1).tolist()
    prompts = input_ids.tolist()
    do_sample = bool(config.do_sample)
    device = model.device
    with drafter.exclusive():  # the whole call, as for one row
        drafter.eos_token_ids = drafter.eos_option | eos
        drafter.vocab_size = vocab_size(model)
        drafter.reset(())  # files the drafter's last request into memory; its stats will describe this call
        rows = []
        for i in range(batch):
            child = drafter.sibling()
            child.reset(prompts[i][pads[i] :])
            sizer = DraftSizer(_UNUSED_COSTS, drafter.max_ngram) if drafter.cost_aware else None
            rows.append(_Row(child, sizer, list(prompts[i]), pads[i], child.stats, row_processors(processors, i, batch)))
        fit = StepCostFit(fixed_cost_tokens(model)) if drafter.cost_aware else None
        logits_to_keep = supports_logits_to_keep(model)
        cache = _RowCache(new_cache(model), batch)
        if not cache_rows_gatherable(cache.cache):
            raise UnsupportedGenerationError(f"{type(model).__name__} keeps sliding-window cache layers, which cannot be gathered "
                                             "per row: generate one row at a time")
        active = rows
        first = True
        with torch.inference_mode():
            while active:
                tree_step = use_tree and not first  # the prefill step verifies chains, as for one row
                plans = _plan(active, fit, tree_step, max_tree_nodes, max_len, first)
                start = time.perf_counter()
                walks, width = _verify(model, cache, active, plans, first, tree_step, do_sample, logits_to_keep, device)
                if fit is not None and not first:
                    fit.add(len(active) * width, time.perf_counter() - start)  # the step's real shape, rows x width
                going, kept_blocks = [], []
                for r, (row, plan, (kept, choice, kept_block)) in enumerate(zip(active, plans, walks)):
                    if row.sizer is not None and len(plan.chain):
                        row.sizer.observed(plan.chain.match_len, plan.chain.token_ids.tolist(), plan.size, kept + [choice],
                                           len(row.context) - row.pad)
                    row.drafter.stats.record(len(plan.draft), len(kept))
                    new = kept + [choice]
                    stop_at = _stop_index(row.context, new, max_len, eos, criteria, stop)
                    new = new if stop_at is None else new[:stop_at]
                    row.context += new
                    row.drafter.extend(new)
                    if stop_at is not None:
                        row.drafter.reset(())  # finished: its prompt and whole output go into the shared memory
                        continue
                    if row.sizer is not None:
                        row.sizer.settle(row.drafter.index.tokens)
                    going.append(r)
                    kept_blocks.append(kept_block)
                if going:
                    cache.keep(going, kept_blocks, width)
                    for r, kept_block in zip(going, kept_blocks):
                        active[r].cached += len(kept_block)
                active = [active[r] for r in going]
                first = False
        for row in rows:
            drafter.stats.add(row.stats)
    pad = pad_token_id(config)
    longest = max(len(row.context) for row in rows)
    sequences = torch.tensor([row.context + [pad] * (longest - len(row.context)) for row in rows], dtype=torch.long,
                             device=input_ids.device)
    if config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


def _plan(active: list[_Row], fit: StepCostFit | None, tree: bool, max_tree_nodes: int, max_len: int, first: bool) -> list[_Plan]:
    """Each row's draft for one step, sized to finish the batch soonest (static_batch_draft_sizes).

    Sized, the first step (the prefill) verifies no drafts: it is compute-bound (B x L tokens),
    so drafts there cost their share, and they could save at most one step."""
    rooms = [max_len - len(row.context) - 1 for row in active]  # the step's own token takes the last place
    if fit is None:  # unsized: whole drafts
        if tree:
            drafts = [row.drafter.propose_tree(room, max_tree_nodes=max_tree_nodes) for row, room in zip(active, rooms)]
            return [_Plan(d.prefix(0), d, 0) for d in drafts]
        chains = [row.drafter.propose(room) for row, room in zip(active, rooms)]
        return [_Plan(c, c, len(c)) for c in chains]
    chains = [row.drafter.propose(room) for row, room in zip(active, rooms)]
    if first:
        return [_Plan(c, c.prefix(0), 0) for c in chains]
    chances = [row.sizer.keep_chance(c.match_len) for row, c in zip(active, chains)]
    rates = [row.stats.tau for row in active]  # the row's tokens per step so far (the prefill's step included)
    sizes = static_batch_draft_sizes(chances, [len(c) for c in chains], [room + 1 for room in rooms], rates,
                                     fixed_cost_tokens=fit.fixed_cost_tokens)
    width = max(sizes)
    if not tree or width == 0:
        return [_Plan(c, c.prefix(s), s) for c, s in zip(chains, sizes)]
    # A tree fills the row's slots up to the width the chains bought: those columns are paid for.
    return [_Plan(c, row.drafter.propose_tree(room, max_tree_nodes=min(max_tree_nodes, width)) if s else c.prefix(0), s)
            for row, room, c, s in zip(active, rooms, chains, sizes)]


def _verify(model, cache: "_RowCache", active: list[_Row], plans: list[_Plan], first: bool, tree: bool, do_sample: bool,
            logits_to_keep: bool, device) -> tuple[list[tuple[list[int], int, list[int]]], int]:
    """One forward pass over every active row's block; per row (kept draft tokens, the model's own token, kept block
    indices: the real uncached tokens and the walked path), and the block width."""
    u = len(active[0].context) if first else 1  # uncached tokens per row: the padded prompt, or the last own token
    cached = len(cache)  # S: cache slots per row, real or not
    width = u + max(len(p.draft) for p in plans)
    b = len(active)
    tokens = torch.zeros((b, width), dtype=torch.long)  # (rows, width): fill 0, masked
    positions = torch.ones((b, width), dtype=torch.long)  # (rows, width): padding and fill at 1, as plain generate's padding
    real = torch.zeros((b, cached + width), dtype=torch.bool)  # (rows, keys): which keys are real tokens of the row
    real[:, :cached] = cache.real
    blocks = []
    for r, (row, plan) in enumerate(zip(active, plans)):
        n = len(plan.draft)
        skip = row.pad if first else 0  # left padding inside the block
        ids = row.context[-u:] + plan.draft.token_ids.tolist()
        parents = list(range(-1, u - 1)) + [u - 1 if p < 0 else u + p for p in plan.draft.parents.tolist()]
        depth = [0] * (u + n)
        for i in range(u, u + n):
            depth[i] = depth[parents[i]] + 1
        tokens[r, : u + n] = torch.tensor(ids)
        own = row.cached + (u - 1 - skip)  # position of the row's last uncached token
        positions[r, skip:u] = torch.arange(row.cached, own + 1)
        if n:
            positions[r, u : u + n] = own + torch.tensor(depth[u:])
        real[r, cached + skip : cached + u + n] = True
        blocks.append((ids, parents, skip))
    tokens, positions = tokens.to(device), positions.to(device)
    keep = {"logits_to_keep": width - u + 1} if logits_to_keep else {}
    first_logit = u - 1 if keep else 0  # block index of logits row 0
    if tree:
        visible = torch.zeros((b, width, cached + width), dtype=torch.bool)  # (rows, queries, keys)
        visible[:, :, :cached] = real[:, None, :cached]
        for r, (plan, (ids, _, skip)) in enumerate(zip(plans, blocks)):
            m = len(ids)
            visible[r, :m, cached : cached + m] = _tree_visibility(u, plan.draft.parents)
            visible[r, :, cached + torch.arange(width)] &= real[r, cached:]  # no key of padding or fill
        visible[:, torch.arange(width), cached + torch.arange(width)] = True  # every query sees itself (fill included)
        dtype = model.dtype if model.dtype.is_floating_point else torch.float32
        attention = torch.zeros((b, 1, width, cached + width), dtype=dtype)
        attention.masked_fill_(~visible[:, None], torch.finfo(dtype).min)
        attention = attention.to(device)
    else:
        attention = real.long().to(device)
    out = model(input_ids=tokens, cache=cache.cache, use_cache=True, attention_mask=attention, position_ids=positions, **keep)
    logits = out.logits.float()
    walks = []
    for r, (row, (ids, parents, skip)) in enumerate(zip(active, blocks)):
        path, choice = _walk(row.processors, logits[r], first_logit, ids, parents, u, row.context, do_sample)
        walks.append(([ids[i] for i in path[1:]], choice, list(range(skip, u)) + path[1:]))
    return walks, width


class _RowCache:
    """The active rows' KV cache, (rows, S) slots each, and which slots hold each row's real tokens.

    A slot that is not real (left padding, fill, a dropped branch) is masked in every step.
    """

    def __init__(self, cache, rows: int):
        self.cache = cache
        self.real = torch.zeros((rows, 0), dtype=torch.bool)  # (rows, S): slot s of row r is one of its tokens

    def __len__(self) -> int:
        return self.real.shape[1]

    def keep(self, going: list[int], kept_blocks: list[list[int]], width: int) -> None:
        """After a step over `width` block slots: keeps the rows `going` (indices among the step's rows) and, of row
        going[i]'s block, the entries kept_blocks[i] (ascending)."""
        start = self.real.shape[1]  # the block's first slot
        longest = max(len(kept) for kept in kept_blocks)
        contiguous = all(kept[-1] - kept[0] + 1 == len(kept) for kept in kept_blocks if kept)
        if contiguous and len(going) == self.real.shape[0]:  # chains: the kept entries stay where they are
            end = max(kept[-1] + 1 for kept in kept_blocks)
            block = torch.zeros((len(going), end), dtype=torch.bool)
            for i, kept in enumerate(kept_blocks):
                block[i, kept[0] : kept[-1] + 1] = True
            drop_cache_tail(self.cache, width - end)
            self.real = torch.cat([self.real, block], dim=1)
        elif len(going) == self.real.shape[0]:  # trees: each row's path packed to the block's front
            index = torch.zeros((len(going), longest), dtype=torch.long)  # (rows, slots): offsets in the block
            block = torch.zeros((len(going), longest), dtype=torch.bool)
            for i, kept in enumerate(kept_blocks):
                index[i, : len(kept)] = torch.tensor(kept)
                block[i, : len(kept)] = True
            gather_cache_tail(self.cache, start, index)
            self.real = torch.cat([self.real, block], dim=1)
        else:
            self.real = torch.cat([self.real, torch.zeros((self.real.shape[0], width), dtype=torch.bool)], dim=1)
            for r, kept in zip(going, kept_blocks):
                self.real[r, [start + k for k in kept]] = True
            self._compact(going)
            return
        if self.real.shape[1] > 1.25 * int(self.real.sum(dim=1).max()) + 16:
            self._compact(list(range(self.real.shape[0])))

    def _compact(self, going: list[int]) -> None:
        """Keeps the rows `going`, each its real slots only, left-padded: the whole cache gathered."""
        real = self.real[going]
        lengths = real.sum(dim=1)
        longest = int(lengths.max())
        index = torch.zeros((len(going), longest), dtype=torch.long)  # (rows, slots); a padding slot reads slot 0
        compacted = torch.zeros((len(going), longest), dtype=torch.bool)
        for i in range(len(going)):
            length = int(lengths[i])
            index[i, longest - length :] = real[i].nonzero()[:, 0]
            compacted[i, longest - length :] = True
        gather_cache_rows(self.cache, torch.tensor(going), index)
        self.real = compacted


def _check_batch(model, config, streamer, eos: set[int], stop, criteria) -> None:
    if streamer is not None:
        raise UnsupportedGenerationError("streaming a batch is not supported (transformers' streamers take one row): generate without streamer=")
    if config.return_dict_in_generate and (config.output_scores or config.output_logits):
        raise UnsupportedGenerationError(
            "scores and logits are returned for one row (batch size 1, unpadded): a batch's finished rows stop "
            "computing, so there are no scores to match plain generate's for them"
        )
    if pad_token_id(config) is None and (eos or stop is not None or criteria):
        raise ValueError("a batch whose rows can end early needs pad_token_id (plain generate pads finished rows with it)")
