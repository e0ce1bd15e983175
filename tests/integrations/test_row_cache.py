"""RowCache with verify.build_block: after every step each row's real slots hold exactly its kept tokens."""

import random

import numpy as np
import pytest
import torch

from lookahead.draft import Draft
from lookahead.integrations.hf import cache_inputs, new_cache
from lookahead.integrations.row_cache import RowCache
from lookahead.integrations.verify import build_block
from tests.models import VOCAB, stories_model, tiny_model


def random_draft(rng: random.Random, tree: bool, vocab: int) -> Draft:
    n = rng.randint(0, 6)
    ids = np.array([rng.randrange(3, vocab) for _ in range(n)], dtype=np.int64)
    if not tree:
        return Draft.chain(ids)
    return Draft(ids, np.array([rng.randint(-1, i - 1) for i in range(n)], dtype=np.int64))


def kept_path(rng: random.Random, block, r: int) -> list[int]:
    """A random root path of row r's draft (what a walk might keep), as block entries after the uncached ones."""
    parents, path, node = block.parents[r], [], block.uncached - 1
    while True:
        children = [i for i in range(block.uncached, len(parents)) if parents[i] == node]
        if not children or rng.random() < 0.3:
            return path
        node = rng.choice(children)
        path.append(node)


def assert_rows_hold_their_tokens(model, cache: RowCache, rows: list[list[int]]):
    slots = cache.real_tokens()
    with torch.no_grad():
        for r, tokens in enumerate(rows):
            assert slots[r] == len(tokens)
            fresh = model(torch.tensor([tokens]), use_cache=True).past_key_values
            real = cache.slots()[r].nonzero()[:, 0]
            for layer, fresh_layer in zip(cache.cache.layers, fresh.layers):
                torch.testing.assert_close(layer.keys[r, :, real], fresh_layer.keys[0], atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(layer.values[r, :, real], fresh_layer.values[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_each_rows_real_slots_equal_a_fresh_forward_of_its_kept_tokens_after_every_step(tree, seed):
    # Random drafts, random kept paths, rows leaving at random: holes from padding, fill and
    # dropped branches, the tail packed, compaction when rows leave; never another row's token.
    rng = random.Random(seed)
    model = tiny_model("llama") if seed else stories_model()
    vocab = model.config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(2, 9))] for _ in range(rng.randint(2, 4))]
    width = max(len(p) for p in prompts)
    contexts = [[0] * (width - len(p)) + p for p in prompts]
    pads = [width - len(p) for p in prompts]
    kept = [[] for _ in prompts]  # per row, its tokens in the cache
    cache = RowCache(new_cache(model), len(prompts))
    active = list(range(len(prompts)))
    cached = [0] * len(prompts)
    first, steps = True, 0
    with torch.no_grad():
        while active and steps < 12:
            drafts = [random_draft(rng, tree and not first, vocab) for _ in active]
            u = width if first else 1
            assert cache.real_tokens() == [cached[r] for r in active]
            block = build_block([contexts[r] for r in active], drafts, [pads[r] if first else 0 for r in active], cache,
                                uncached=u, dtype=model.dtype)
            extra = {} if block.attention is None else dict(attention_mask=block.attention, position_ids=block.positions)
            model(input_ids=block.tokens, **cache_inputs(model, cache.cache), **extra)
            going, kept_blocks = [], []
            for i, r in enumerate(active):
                path = kept_path(rng, block, i)
                tokens = [block.ids[i][e] for e in range(block.skips[i], u)] + [block.ids[i][e] for e in path]
                own = rng.randrange(3, vocab)  # the step's own token: in the sequence, not yet in the cache
                contexts[r] += [block.ids[i][e] for e in path] + [own]
                if rng.random() < 0.2 and not first:
                    continue  # the row ends: it leaves the block
                kept[r] += tokens
                cached[r] += len(tokens)
                going.append(i)
                kept_blocks.append(list(range(block.skips[i], u)) + path)
            if going:
                cache.keep(going, kept_blocks, block.tokens.shape[1])
            active = [active[i] for i in going]
            if active:
                assert_rows_hold_their_tokens(model, cache, [kept[r] for r in active])
            first, steps = False, steps + 1
    assert steps >= 2


def test_a_single_row_never_has_holes():
    model = tiny_model("llama")
    rng = random.Random(0)
    cache = RowCache(new_cache(model), 1)
    context, cached, tokens = [5, 6, 7, 8], 0, []
    with torch.no_grad():
        for step in range(8):
            u = len(context) - cached
            draft = random_draft(rng, step > 0, VOCAB)
            block = build_block([context], [draft], [0], cache, uncached=u, dtype=model.dtype)
            assert (block.attention is None) == (not block.is_tree)  # chains: the model's own causal mask
            extra = {} if block.attention is None else dict(attention_mask=block.attention, position_ids=block.positions)
            model(input_ids=block.tokens, **cache_inputs(model, cache.cache), **extra)
            path = kept_path(rng, block, 0)
            tokens += [block.ids[0][e] for e in list(range(u)) + path]
            context += [block.ids[0][e] for e in path] + [rng.randrange(3, VOCAB)]
            cache.keep([0], [list(range(u)) + path], block.tokens.shape[1])
            cached = len(tokens)
            assert cache.real is None and len(cache) == cached == cache.cache.get_seq_length()
    assert_rows_hold_their_tokens(model, cache, [tokens])
