"""One verify step's pieces: the block of R rows, its forward pass, the target's walk down it, the stop check.

A step's block holds, per row, its u uncached tokens (the padded prompt on the first step,
else its last own token) and its draft, right-padded with fill to the step's width W.
Each draft node hangs from its parent (-1: the row's last uncached token) and sits at
position (the row's real tokens before it) + depth. Rows whose cache has no holes, a block
without padding or fill, and a chain: the model's own causal mask (no mask is passed). Otherwise a 2-D mask over [cache slots, block] hides the slots that are not
the row's real tokens (chains: the model adds the causal part), or a 4-D additive mask
lets each node see the row's real cache, the uncached tokens and its own ancestors (trees).

The walk (acceptance rule): starting at a row's last uncached token, the target's choice at
each node (argmax, or a draw from the processed distribution) is looked up among the
node's children: found, descend; not found, it is the step's own token. Greedy: every kept
token is the model's argmax given exactly the tokens before it. Sampling: every kept token
is a draw from the model's processed distribution given the tokens before it; a draft only
decides whether that draw is already computed.
"""

import functools
import itertools
from dataclasses import dataclass

import numpy as np
import torch
from numba import njit

from lookahead.draft import Draft
from lookahead.integrations.hf import cache_inputs, first_stop, keep_rollback, takes
from lookahead.integrations.row_cache import RowCache


@dataclass
class Block:
    """A (rows, width) verify block and what the walk needs of it."""

    tokens: torch.Tensor  # (rows, width) int64, fill 0
    positions: torch.Tensor  # (rows, width) int64, as plain generate numbers them (padding and fill at 1)
    attention: torch.Tensor | None  # (rows, keys) 0/1, or (rows, 1, width, keys) additive; None: causal
    ids: list[list[int]]  # per row, its entries: u uncached tokens, then its draft's nodes
    parents: list[list[int]]  # per row, each entry's parent entry (-1: none)
    skips: list[int]  # per row, left padding at the block's front (the prefill of a padded row)
    uncached: int  # u: uncached tokens per row
    is_tree: bool


def build_block(contexts: list[list[int]], drafts: list[Draft], skips: list[int], cache: RowCache, *, uncached: int,
                dtype: torch.dtype) -> Block:
    """The step's block for rows whose last `uncached` tokens are not in `cache` yet.

    Args:
        contexts: per row, its tokens as plain generate holds them (left padding included).
        drafts: per row, what it verifies (chain or tree).
        skips: per row, left padding among its uncached tokens.
        cache: the rows' cache: its length S, and which slots hold each row's real tokens.
        dtype: the additive mask's dtype (the model's).
    Cost: O(rows * width) Python and a few tensor constructions; trees add O(nodes^2) bits per row.
    """
    u, rows, slots = uncached, len(drafts), len(cache)
    width = u + max(len(d) for d in drafts)
    ids, parents, is_tree = [], [], False
    for context, draft in zip(contexts, drafts):
        n = len(draft)
        ids.append(context[-u:] + draft.token_ids.tolist())
        if draft.is_chain:
            parents.append(list(range(-1, u + n - 1)))
            continue
        parents.append(list(range(-1, u - 1)) + [u - 1 if p < 0 else u + p for p in draft.parents.tolist()])
        is_tree = True
    lengths = [len(row) for row in ids]
    tokens = id_tensor([row + [0] * (width - n) for row, n in zip(ids, lengths)] if min(lengths) < width else ids)
    if not is_tree and cache.real is None and not any(skips) and min(lengths) == width:
        # the model's own causal mask; every row's positions follow its S real slots
        return Block(tokens, torch.arange(slots, slots + width).expand(rows, width), None, ids, parents, skips, u, False)
    if is_tree:  # every row's positions and what its queries may not see, in one kernel call (tree_rows)
        hidden, positions = np.empty((rows, width, width), dtype=np.bool_), np.empty((rows, width), dtype=np.int64)
        starts = np.zeros(rows + 1, dtype=np.int64)
        starts[1:] = np.cumsum([len(draft) for draft in drafts])
        tree_rows(u, np.concatenate([draft.parents for draft in drafts]), starts, np.asarray(skips, dtype=np.int64),
                  np.asarray(lengths, dtype=np.int64), np.asarray(cache.real_tokens(), dtype=np.int64), hidden, positions)
        bits, low = _mask_bits(dtype)  # the mask written as the dtype's bit patterns: 0 (0.0) or low's
        attention = np.empty((rows, 1, width, slots + width), dtype=bits)
        additive_mask(hidden, NO_HOLES if cache.real is None else cache.real.numpy(), low, attention)
        return Block(tokens, torch.from_numpy(positions), torch.from_numpy(attention).view(dtype), ids, parents, skips, u, True)
    # Entry j of row r is a real token of it for skip[r] <= j < its length; in a chain it sits at position
    # cached[r] + j - skip[r] (its real tokens before it); padding and fill at 1, as plain generate's padding.
    entry = np.arange(width)
    skip, length = np.asarray(skips)[:, None], np.asarray(lengths)[:, None]
    block_keys = (entry >= skip) & (entry < length)  # (rows, width) which block entries are real tokens of the row
    positions = np.where(block_keys, np.asarray(cache.real_tokens())[:, None] - skip + entry, 1)  # (rows, width) int64
    return Block(tokens, torch.from_numpy(positions), torch.cat([cache.slots(), torch.from_numpy(block_keys)], dim=1).long(),
                 ids, parents, skips, u, False)


def forward_block(model, block, cache: RowCache, logits_to_keep: bool, device) -> tuple[torch.Tensor, int]:
    """(rows, entries, vocab) logits of the block in the model's dtype, and the block entry of logits row 0.

    Logits only where the walk reads them: the last uncached token and the draft nodes (a
    prompt's logits over a large vocabulary would cost more than the forward pass)."""
    width, u = block.tokens.shape[1], block.uncached
    keep = {"logits_to_keep": width - u + 1} if logits_to_keep else {}
    if block.attention is not None:
        keep["attention_mask"] = block.attention.to(device)
    if takes(type(model), "position_ids"):  # as plain generate passes them (a RoBERTa-style family would offset its own)
        keep["position_ids"] = block.positions.to(device)
    keep_rollback(cache.cache, width - u + 1)  # the step's crop removes at most the width - u draft nodes
    out = model(input_ids=block.tokens.to(device), **cache_inputs(model, cache.cache), **keep)
    return out.logits, (u - 1 if logits_to_keep else 0)


def id_tensor(ids: list) -> torch.Tensor:
    """Token ids (a list of ints, or of equal-length lists) as an int64 tensor on the CPU, through numpy:
    torch.tensor reads Python ints 8x slower (1,500 ids: 123 µs against 16)."""
    return torch.from_numpy(np.array(ids, dtype=np.int64))


def tree_visibility(u: int, parents: np.ndarray) -> np.ndarray:
    """(u + n, u + n) bools: block token j is token i or one of its ancestors (one row's tree_rows, read the other way)."""
    width = u + parents.shape[0]
    hidden, positions = np.empty((1, width, width), dtype=np.bool_), np.empty((1, width), dtype=np.int64)
    none = np.zeros(1, dtype=np.int64)
    tree_rows(u, parents, np.array([0, parents.shape[0]]), none, np.array([width]), none, hidden, positions)
    return ~hidden[0]


NO_HOLES = np.ones((0, 0), dtype=np.bool_)  # additive_mask's `real` where every cached slot is a real token


@functools.cache
def _mask_bits(dtype: torch.dtype) -> tuple[np.dtype, int]:
    """(the numpy integer type of dtype's width, the bit pattern of dtype's lowest finite value as one)."""
    bits = {2: np.int16, 4: np.int32, 8: np.int64}[torch.finfo(dtype).bits // 8]
    return bits, int(torch.tensor(torch.finfo(dtype).min, dtype=dtype).view(getattr(torch, np.dtype(bits).name)).item())


@njit(cache=True)
def additive_mask(hidden, real, low, out):  # pragma: no cover (compiled)
    """A tree block's 4-D additive mask, as bit patterns: out[r, 0, i, j] = low (the dtype's lowest value) where query
    i may not see key j, else 0 (0.0). Keys j < S (S = out.shape[3] - width) are the cache's slots, hidden where
    real[r, j] is False (real of shape (0, 0): none hidden); the rest the block's, hidden where hidden[r, i, j - S].
    O(rows * width * (S + width))."""
    width = hidden.shape[1]
    slots = out.shape[3] - width
    for r in range(out.shape[0]):
        for i in range(width):
            for j in range(slots):
                out[r, 0, i, j] = low if real.shape[0] and not real[r, j] else 0
            for j in range(width):
                out[r, 0, i, slots + j] = low if hidden[r, i, j] else 0


@njit(cache=True)
def tree_rows(u, parents, starts, skips, lengths, real, hidden, positions):  # pragma: no cover (compiled)
    """A tree block's rows: row r's u uncached tokens, then its draft's nodes parents[starts[r]:starts[r + 1]]
    (parents[i] < i, -1: the last uncached token), its entries skips[r] <= j < lengths[r] its real tokens (the rest:
    padding, fill). Writes every hidden[r, i, j]: whether query i may not see block key j. A query sees its own entry
    and, of the row's real tokens, the uncached ones up to it (a causal chain), or a node its ancestors (a node's
    row is its parent's and itself). Writes positions[r, j]: a real uncached token's real[r] - skips[r] + j (real[r]:
    the row's real cached tokens), a node's its last uncached token's + its depth (1 for a root), padding and fill
    at 1. O(rows * width^2)."""
    width = hidden.shape[1]
    for r in range(hidden.shape[0]):
        skip, length, first = skips[r], lengths[r], starts[r]
        hidden[r] = True
        for i in range(u):
            positions[r, i] = real[r] - skip + i
            for j in range(i + 1):
                hidden[r, i, j] = False
        for i in range(starts[r + 1] - first):
            row, p = u + i, parents[first + i]
            above = u - 1 if p < 0 else u + p  # its parent's block entry
            for j in range(above + 1):
                hidden[r, row, j] = hidden[r, above, j]
            hidden[r, row, row] = False
            positions[r, row] = positions[r, above] + 1
        for j in range(width):
            if j < skip or j >= length:  # no key of padding or fill, at position 1
                for i in range(width):
                    hidden[r, i, j] = True
                positions[r, j] = 1
            hidden[r, j, j] = False  # every query sees itself (fill included)


def walk(processors, logits: torch.Tensor, first: int, tokens: list[int], parents: list[int], u: int, sequence: list[int],
         do_sample: bool, record: list | None = None, argmax: list[int] | None = None) -> tuple[list[int], int]:
    """The target's walk down one row's verified block: (block entries kept, from u - 1; the model's own token).

    tokens/parents: the row's entries, u uncached tokens then draft nodes (parents[i] < i);
    logits: (entries from `first` on, vocab), None with `argmax`. sequence: what the processors read before the
    block's path (its uncached tokens included). With `record`, appends (processed scores,
    raw logits), each (1, vocab) float32, per token returned. `argmax`: the logits' argmax
    per entry from `first` on, read once for the whole block where nothing processes the
    scores (greedy_choices): then the walk reads no tensor.
    """
    children: dict[tuple[int, int], int] = {(parents[i], tokens[i]): i for i in range(u, len(tokens))}
    path = [u - 1]
    while True:
        node = path[-1]
        if argmax is not None:
            choice = argmax[node - first]
        else:
            context = id_tensor([sequence + [tokens[i] for i in path[1:]]]).to(logits.device) if len(processors) else None
            choice, processed = choose(processors, context, logits[node - first], do_sample)
            if record is not None:
                record.append((processed, logits[node - first][None].clone()))
        child = children.get((node, choice))
        if child is None:
            return path, choice
        path.append(child)


def top_ids(logits: torch.Tensor, entries: list[list[int]], k: int) -> list[np.ndarray]:
    """Per row r, (len(entries[r]), k) int32: the k highest-scoring ids at each of its logit positions
    entries[r], highest first (among equal scores, on a CPU the lower id first). Cost: a top-k over (sum of the
    entries, vocab), one transfer. On a CPU a scan in numba (top_k_rows) over the float32 logits (others: the
    picked positions widened), 1.5-5x torch's topk (float32, 8 positions at 128,256 ids: 0.55 ms against 2.6 at one
    thread, 0.45 against 1.65 at two; 31 positions at two: 1.7 against 2.6; 8 at 4,096 ids: 25 us against 113);
    elsewhere torch's topk."""
    k = min(k, logits.shape[-1])
    width, vocab = logits.shape[1], logits.shape[-1]
    if logits.is_cpu:
        e = entries[0]
        positions = np.arange(e.start, e.stop, e.step, dtype=np.int64) if len(entries) == 1 and isinstance(e, range) else \
            np.fromiter((r * width + i for r, row in enumerate(entries) for i in row), dtype=np.int64)
        scores = logits.reshape(-1, vocab)
        if scores.dtype != torch.float32:
            scores, positions = scores[torch.from_numpy(positions)].float(), np.arange(positions.shape[0], dtype=np.int64)
        ids = np.empty((positions.shape[0], k), dtype=np.int32)
        top_k_rows(scores.numpy(), positions, ids)
    elif len(entries) == 1 and isinstance(entries[0], range) and entries[0].step == 1:  # one row's contiguous entries: a view
        ids = logits[0, entries[0].start : entries[0].stop].topk(k, dim=-1).indices.to(torch.int32).cpu().numpy()
    else:
        flat = torch.tensor([r * width + i for r, row in enumerate(entries) for i in row], dtype=torch.long, device=logits.device)
        ids = logits.reshape(-1, vocab)[flat].topk(k, dim=-1).indices.to(torch.int32).cpu().numpy()
    if len(entries) == 1:
        return [ids]
    ends = list(itertools.accumulate(len(row) for row in entries))
    return [ids[end - len(row) : end] for row, end in zip(entries, ends)]


@njit(cache=True)
def top_k_rows(scores, positions, out):  # pragma: no cover (compiled)
    """out[j] = the out.shape[1] highest-scoring ids of scores[positions[j]], highest first, the lower id first among
    equals (NaN never taken; fewer finite scores than k: -inf's ids fill the rest, as a ranking would).
    One pass a row, O(vocab) compares (each new leader: O(k) moves)."""
    k = out.shape[1]
    best = np.empty(k, dtype=scores.dtype)
    for j in range(positions.shape[0]):
        row = scores[positions[j]]
        held = 0
        for i in range(row.shape[0]):
            x = row[i]
            if held == k and not x > best[k - 1]:
                continue
            if held < k and not x >= -np.inf:  # NaN
                continue
            slot = held if held < k else k - 1
            while slot > 0 and x > best[slot - 1]:
                best[slot], out[j, slot] = best[slot - 1], out[j, slot - 1]
                slot -= 1
            best[slot], out[j, slot] = x, i
            held = min(held + 1, k)
        for slot in range(held, k):  # (a row of NaNs)
            out[j, slot] = -1


def greedy_choices(logits: torch.Tensor, processors, do_sample: bool, record) -> list[list[int]] | None:
    """Per row and entry, the logits' argmax, in one read from the device (one sync per step, not
    one per kept token), where greedy choices need no processing and no scores are returned.

    On a CPU numpy's argmax reads float32 logits (others widened: exactly, so the same argmax as plain
    generate's over its float32 scores); torch's CPU argmax over the last dim took 13x numpy's at one
    thread (a (17, 128256) block: 1.2 ms against 0.1 ms in float32, 7 ms in bfloat16). Both return the
    first of equal maxima (and the first NaN), as plain generate's torch.argmax does."""
    if do_sample or len(processors) or record is not None:
        return None
    if logits.is_cpu:  # (device.type would build a device object every step)
        return (logits if logits.dtype == torch.float32 else logits.float()).numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def choose(processors, context: torch.LongTensor | None, logits: torch.Tensor, do_sample: bool) -> tuple[int, torch.Tensor]:
    """(the token chosen, the (1, vocab) processed scores it was chosen from); `context`: the ids the processors read."""
    scores = logits[None].clone()
    if len(processors):
        scores = processors(context, scores)
    if do_sample:
        return int(torch.multinomial(torch.softmax(scores[0], dim=-1), 1)), scores
    return int(scores[0].argmax()), scores


def stop_index(sequence: list[int], new: list[int], max_len: int, eos: frozenset[int], criteria, stop) -> int | None:
    """How many of `new` to keep if generation stops among them (None: it goes on).

    `stop` (a StopStringCriteria) is checked after every token of `new`, as plain generate
    checks it, in one batched call on the last tokens it reads (first_stop); `criteria`
    (user stopping criteria) after every token too.
    """
    if stop is None and not criteria and len(sequence) + len(new) < max_len and eos.isdisjoint(new):
        return None  # (most steps: no token below can stop it)
    completes = len(new) if stop is None else first_stop([stop], torch.tensor(sequence[-stop.maximum_token_len :]), np.asarray(new))
    for i, token in enumerate(new):
        length = len(sequence) + i + 1
        if token in eos or length >= max_len or i == completes:
            return i + 1
        if criteria:
            ids = id_tensor([sequence + new[: i + 1]])
            if any(bool(c(ids, None).any()) for c in criteria):
                return i + 1
    return None
