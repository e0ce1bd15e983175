"""A representative subset of the families sweep (lookahead.bench.families): every path exact or refused by us.

The whole sweep (every causal-LM family of the installed transformers, ~75 s on a quiet 2-core
machine) is one command: `OMP_NUM_THREADS=1 nice -n 19 python -m lookahead.bench.families`
(docs/families.md). Here, one or two families of each kind it found:
"""

import functools
import weakref

import pytest
import torch

from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import lookahead
from lookahead import LookupDrafter, UnsupportedGenerationError
from lookahead.bench.families import WINDOW, prompt, run_family, tiny_model
from lookahead.integrations.hf import RECURRENT_ROLLBACK, cache_inputs
from lookahead.integrations import support
from lookahead.integrations.support import tree_support

SUBSET = {  # those the installed transformers has (lfm3 is newer than 5.17)
    "llama": "full attention: chains and trees",
    "gpt2": "learned absolute positions",
    "roberta": "learned positions offset from the padding id (was DIFFERENT: positions not passed as generate does)",
    "mistral": "a sliding window of 8 on every layer (was CRASHED in crop)",
    "gemma2": "alternating local / global layers",
    "gpt_oss": "sliding window and MoE",
    "deepseek_v3": "latent attention (MLA) and MoE",
    "lfm3": "hybrid: convolution, attention and sliding-window layers (was CRASHED in crop)",
    "bloom": "ALiBi, no 4-D mask: chains only (was CRASHED in the calibration's tree forward)",
    "bart": "a decoder whose attention does not take the tree mask as given: trees refused by the probe",
    "mamba": "state-space: chains from transformers 5.25, refused before (was CRASHED inside the cache)",
    "qwen3_next": "linear attention hybrid: chains from transformers 5.25, refused before",
    "xlnet": "a cache of its own: refused",
    "openai-gpt": "no KV cache: refused",
    "prophetnet": "a cache that takes one new token per forward: refused by the probe (transformers' PLD crashes)",
}


@functools.cache
def family_row(family: str) -> dict:
    """run_family(family), run once: three tests read its row (cached: do not mutate it)."""
    return run_family(family)


@pytest.mark.parametrize("family", [f for f in SUBSET if f in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES])
def test_every_path_is_exact_or_refused(family):
    row = family_row(family)
    assert row["skipped"] is None, row
    for path in ("assistant", "chain", "tree"):
        assert row[path] == "exact" or row[path].startswith("refused"), (path, row[path])


@pytest.mark.parametrize("family", [f for f in ("llama", "gpt2", "roberta", "mistral", "gemma2", "gpt_oss", "deepseek_v3", "lfm3", "bloom")
                                    if f in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES])
def test_chains_exact_through_both_entry_points(family):
    row = family_row(family)
    assert (row["assistant"], row["chain"]) == ("exact", "exact"), row


def generate_with_rollbacks(model, family: str, entry: str):
    """(prompt, got, plain greedy's, drafter): 40 greedy tokens through `entry`, unsized chains, after a prompt
    that ends with 12 tokens seen 40 tokens earlier, so the lookup drafts what followed them: a long draft
    rejected right after the prefill, then one accepted (long after a sliding window filled)."""
    start = prompt(family)
    ids = torch.cat([model.generate(start, max_new_tokens=40, do_sample=False), start[:, -12:]], dim=1)
    options = dict(max_new_tokens=40, do_sample=False)
    expected = model.generate(ids, **options)
    drafter = LookupDrafter(cost_aware=False)
    if entry == "assistant_model":
        got = model.generate(ids, assistant_model=drafter, **options)
    else:
        got = lookahead.generate(model, ids, drafter=drafter, tree=False, **options)
    return ids, got, expected, drafter


@pytest.mark.parametrize("family", ["mistral", "gemma2", "cohere2"])
@pytest.mark.parametrize("entry", ["assistant_model", "lookahead.generate"])
def test_sliding_window_exact_past_the_window(family, entry):
    model = tiny_model(family)
    assert model.config.sliding_window == WINDOW
    ids, got, expected, drafter = generate_with_rollbacks(model, family, entry)
    assert ids.shape[1] > 8 * WINDOW
    assert got.tolist() == expected.tolist()
    # Kept: 40 tokens in few steps. Rolled back: more tokens drafted than written.
    assert drafter.stats.steps <= 10 and drafter.stats.drafted >= 40 + 20


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_trees_refused_on_sliding_windows_with_the_reason(family):
    model = tiny_model(family)
    with pytest.raises(UnsupportedGenerationError, match=r"sliding_window=8.*cannot be gathered per tree path.*tree=False"):
        lookahead.generate(model, prompt(family), tree=True, max_new_tokens=4, do_sample=False)


def test_trees_exact_where_the_probe_allows_them():
    for family in ("llama", "gpt2", "roberta"):
        assert tree_support(tiny_model(family)) is None
        assert family_row(family)["tree"] == "exact"


@pytest.mark.skipif(RECURRENT_ROLLBACK, reason="transformers >= 5.25 rolls recurrent states back: the next test")
@pytest.mark.parametrize("family", ["mamba", "qwen3_next"])
def test_stateful_models_refused_before_any_forward_pass(family, monkeypatch):
    model = tiny_model(family)
    calls = []
    forward = type(model).forward
    monkeypatch.setattr(type(model), "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))
    with pytest.raises(UnsupportedGenerationError, match="recurrent state"):
        lookahead.generate(model, prompt(family), tree=False, max_new_tokens=4, do_sample=False)
    with pytest.raises(ValueError, match="stateful"):  # transformers refuses first, before it reads the drafter
        model.generate(prompt(family), assistant_model=LookupDrafter(), max_new_tokens=4, do_sample=False)
    assert calls == []


@pytest.mark.skipif(not RECURRENT_ROLLBACK, reason="transformers < 5.25 cannot roll recurrent states back: the test above")
@pytest.mark.parametrize("family", ["mamba", "qwen3_next", "jamba"])
@pytest.mark.parametrize("entry", ["assistant_model", "lookahead.generate"])
def test_recurrent_states_rolled_back_on_chains_and_refused_on_trees_and_batches(family, entry):
    model = tiny_model(family)
    ids, got, expected, drafter = generate_with_rollbacks(model, family, entry)
    assert got.tolist() == expected.tolist()
    assert drafter.stats.drafted >= 40 + 20  # rolled back (hf.keep_rollback): more tokens drafted than written
    options = dict(max_new_tokens=40, do_sample=False)
    with pytest.raises(UnsupportedGenerationError, match=r"LinearAttentionLayer.*cannot be gathered per tree path"):
        lookahead.generate(model, ids, tree=True, **options)
    with pytest.raises(UnsupportedGenerationError, match=r"LinearAttentionLayer.*cannot be gathered per row: generate one row"):
        lookahead.generate(model, torch.cat([ids, ids]), tree=False, **options)


@pytest.mark.skipif(not RECURRENT_ROLLBACK, reason="transformers < 5.25 cannot roll recurrent states back")
@pytest.mark.parametrize("family", ["mamba", "qwen3_next"])
def test_recurrent_cache_returned_at_a_stop_inside_the_kept_block_continues_as_plain_generates(family):
    # The stop's tokens after it were cached by the step: the returned cache drops them (a crop after the loop).
    model = tiny_model(family)
    ids, _, expected, _ = generate_with_rollbacks(model, family, "lookahead.generate")
    keyword = next(iter(cache_inputs(model, None)))
    for eos in dict.fromkeys(expected[0, ids.shape[1]:].tolist()[1:12]):
        options = dict(max_new_tokens=40, do_sample=False, eos_token_id=eos, return_dict_in_generate=True)
        plain = model.generate(ids, **options)
        ours = lookahead.generate(model, ids, drafter=LookupDrafter(cost_aware=False), tree=False, **options)
        assert ours.sequences.tolist() == plain.sequences.tolist()
        with torch.inference_mode():
            logits = [model(input_ids=out.sequences[:, -1:], **{keyword: cache}).logits[0, -1]
                      for out, cache in ((plain, plain.past_key_values), (ours, ours.past_key_values))]
        assert torch.allclose(logits[1], logits[0], rtol=1e-5, atol=1e-5 * float(logits[0].abs().max()))


def test_probe_runs_once_per_model(monkeypatch):
    model = tiny_model("bloom")  # not declared: probed
    found = tree_support(model)
    calls = []
    forward = type(model).forward
    monkeypatch.setattr(type(model), "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))
    assert tree_support(model) == found
    assert calls == []


def test_tree_probe_refuses_a_forward_that_ignores_the_mask(monkeypatch):
    monkeypatch.setattr(support, "DECLARED_EXACT", frozenset())  # probed, as an undeclared family is
    model = tiny_model("gpt2")
    copy = type(model)(model.config).eval()  # a fresh model: its own probe
    copy.load_state_dict(model.state_dict())
    forward = type(copy).forward

    def without_mask(self, *args, attention_mask=None, **kwargs):
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(copy), "forward", without_mask)
    reason = tree_support(copy)
    assert reason is not None and "other logits for a tree" in reason


def test_chain_probe_refuses_a_forward_that_drops_the_cache(monkeypatch):
    # As transformers 5.17's BigBird, RemBERT, RoFormer, ... do for a block of several new tokens (docs/families.md).
    monkeypatch.setattr(support, "DECLARED_EXACT", frozenset())  # probed, as an undeclared family is
    model = tiny_model("llama")
    copy = type(model)(model.config).eval()
    copy.load_state_dict(model.state_dict())
    forward = type(copy).forward
    keyword = next(iter(cache_inputs(copy, None)))

    def without_cache(self, *args, **kwargs):
        kwargs.pop(keyword, None)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(copy), "forward", without_cache)
    with pytest.raises(UnsupportedGenerationError, match="other logits for a block of new tokens after a cache"):
        lookahead.generate(copy, prompt("llama"), tree=False, max_new_tokens=4, do_sample=False)


@pytest.mark.parametrize("family", sorted(f for f in support.DECLARED_EXACT if f in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
def test_a_declared_family_is_what_its_probes_find(family, monkeypatch):
    # declared families skip the probes (a dozen forwards on a first call): their probes must agree
    model = tiny_model(family)
    assert support.declared_exact(model, "chain")
    declared = support.chain_support(model), support.tree_support(model)
    monkeypatch.setattr(support, "DECLARED_EXACT", frozenset())  # probed, as an undeclared family is
    monkeypatch.setattr(support, "PROBED", weakref.WeakKeyDictionary())
    assert (support.chain_support(model), support.tree_support(model)) == declared  # chains exact; trees the same answer
    assert declared[0] is None


def test_a_declared_family_with_an_attention_that_ignores_masks_is_probed(monkeypatch):
    model = tiny_model("llama")
    monkeypatch.setattr(model.config, "_attn_implementation", "flash_attention_2")
    assert support.declared_exact(model, "chain") and not support.declared_exact(model, "tree")
