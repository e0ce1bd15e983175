"""Sampling in a batch draws every row's tokens from the model's own conditional distribution.

As tests/integrations/test_sampling_exact.py, per row: ragged left-padded rows sampled together many
times through our engine (trees, drafts from the rows' own stories and the shared memory);
each row's tokens are judged by the randomized probability integral transform against the
exact conditionals of a one-row forward pass over its finished sequence.
"""

import copy

import numpy as np
import pytest
import torch

import lookahead
from lookahead import LookupDrafter
from tests.cases import story_prompt
from tests.models import stories_model
from tests.integrations.test_generate_batch import left_padded
from tests.integrations.test_sampling_exact import ALPHA, NEW_TOKENS, TEMPERATURE, conditional_logits, pit_values, uniformity_p_value

RUNS = 120  # x 3 rows x 50 tokens = 18,000 sampled tokens, 6,000 per row
SHAPES = ((60, 5), (30, 3), (45, 8))


@pytest.fixture(scope="module")
def sampled():
    model = stories_model()
    prompts = [story_prompt(model, length=length, repeat=repeat) for length, repeat in SHAPES]
    ids, mask = left_padded(prompts)
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None  # fixed length: every row writes NEW_TOKENS
    config.update(do_sample=True, temperature=TEMPERATURE, top_k=0, top_p=1.0, max_new_tokens=NEW_TOKENS)
    drafter = LookupDrafter(cost_aware=False)  # trees verified whole, whatever this process's timing says
    torch.manual_seed(0)
    rows, accepted = [[] for _ in prompts], 0
    for _ in range(RUNS):
        out = model.generate(ids, attention_mask=mask, generation_config=config, custom_generate=lookahead.generate,
                             assistant=drafter, tree=True)
        for r, prompt in enumerate(prompts):
            rows[r].append(out[r, ids.shape[1] - len(prompt) :])
        accepted += drafter.stats.accepted
    rows = [torch.stack(r) for r in rows]
    return [conditional_logits(model, r) for r in rows], prompts, rows, accepted  # each row's exact conditionals, one forward


def test_every_row_draws_from_the_model_distribution(sampled):
    logits, prompts, rows, _ = sampled
    for r, (prompt, sequences) in enumerate(zip(prompts, rows)):
        u = pit_values(logits[r], sequences, len(prompt), TEMPERATURE, seed=r)
        assert u.size == RUNS * NEW_TOKENS
        assert uniformity_p_value(u) > ALPHA / len(prompts), r  # Bonferroni over the rows
    pooled = np.concatenate([pit_values(x, s, len(p), TEMPERATURE, seed=9).ravel() for x, p, s in zip(logits, prompts, rows)])
    assert uniformity_p_value(pooled) > ALPHA


def test_drafts_were_accepted_in_every_batch(sampled):
    *_, accepted = sampled
    assert accepted >= 0.05 * RUNS * len(SHAPES) * NEW_TOKENS


def test_the_test_rejects_a_slightly_wrong_sampler(sampled):
    # Control: the same rows judged as if sampled at a 30% higher temperature fail, pooled (18,000
    # tokens, as the one-row test's 20,000) and each row alone at 6,000 tokens (less power: p < 0.05).
    logits, prompts, rows, _ = sampled
    u = [pit_values(x, sequences, len(prompt), TEMPERATURE * 1.3, seed=r) for r, (x, prompt, sequences) in enumerate(zip(logits, prompts, rows))]
    assert uniformity_p_value(np.concatenate([x.ravel() for x in u])) < ALPHA
    assert max(uniformity_p_value(x) for x in u) < 0.05
