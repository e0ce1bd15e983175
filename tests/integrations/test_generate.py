"""lookahead.generate: our own loop, chains and trees, both entry points, against plain generate."""

import functools

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

import lookahead
from lookahead import LookupDrafter, UnsupportedGenerationError
from lookahead.bench import families
from lookahead.integrations import generate as generate_module
from lookahead.integrations.support import tree_support
from lookahead.integrations.verify import tree_visibility
from lookahead.sizing.cost import LoopCosts
from tests.models import FAMILIES, STORIES, VOCAB, stories_model, tiny_model
from tests.cases import Collect, make_case, story_prompt

TREE_FAMILIES = FAMILIES  # each passes the tree probe (integrations.support.tree_support)
CASES = 12


def plain(model, case):
    return model.generate(torch.tensor([case["prompt"]]), **with_mask(case))


def with_mask(case):
    # Explicit: else transformers reads pad-token ids in a prompt as padding.
    return case["options"] | dict(attention_mask=torch.ones(1, len(case["prompt"]), dtype=torch.long))


SCORES = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)


def assert_same_scores(got, expected, prompt_len):
    """Per new token, the processed scores and raw logits of plain generate (block vs one-token forward: close, not equal)."""
    assert got.sequences.tolist() == expected.sequences.tolist()
    for ours, theirs in ((got.scores, expected.scores), (got.logits, expected.logits)):
        assert len(ours) == len(theirs) == expected.sequences.shape[1] - prompt_len
        for a, b in zip(ours, theirs):
            assert a.shape == b.shape and a.dtype == b.dtype == torch.float32
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)
    assert cache_of(got).get_seq_length() == cache_of(expected).get_seq_length() == expected.sequences.shape[1] - 1


def cache_of(output):
    """The returned cache: field `cache`, or `past_key_values` before transformers 5.2x."""
    return output.cache if "cache" in output.__dataclass_fields__ else output.past_key_values


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", range(CASES))
def test_engine_greedy_matches_plain_generate(family, seed):
    model = tiny_model(family)
    case = make_case(model, 500 + seed, VOCAB)
    if seed % 2:  # half the cases also compare scores, logits and the cache
        case["options"] |= SCORES
    expected = plain(model, case)
    for tree in ([True, False] if family in TREE_FAMILIES else [False]):
        drafter = LookupDrafter(**case["drafter"])
        got = lookahead.generate(model, torch.tensor([case["prompt"]]), drafter=drafter, tree=tree, **with_mask(case))
        if seed % 2:
            assert_same_scores(got, expected, len(case["prompt"]))
        else:
            assert got.tolist() == expected.tolist(), (tree, case)


@pytest.mark.parametrize("tree", [True, False])
def test_scores_and_logits_equal_plain_generates_on_both_entry_points(tree):
    # A regression: return_dict_in_generate returned scores=None and logits=None.
    model = stories_model()
    prompt = story_prompt(model)
    # suppress_tokens: processed scores differ from the raw logits; an EOS ends a long accepted block
    options = dict(max_new_tokens=40, do_sample=False, suppress_tokens=[3], eos_token_id=prompt[20], **SCORES)
    expected = model.generate(torch.tensor([prompt]), **options)
    drafter = LookupDrafter(cost_aware=False)
    got = lookahead.generate(model, torch.tensor([prompt]), drafter=drafter, tree=tree, **options)
    assert max(drafter.stats.accepted_per_step) >= 4
    assert_same_scores(got, expected, len(prompt))
    through = model.generate(torch.tensor([prompt]), custom_generate=lookahead.generate, assistant=LookupDrafter(), tree=tree, **options)
    assert_same_scores(through, expected, len(prompt))
    assert not torch.equal(got.scores[5], got.logits[5])
    only_scores = lookahead.generate(model, torch.tensor([prompt]), tree=tree, max_new_tokens=5, return_dict_in_generate=True, output_scores=True)
    assert only_scores.logits is None and len(only_scores.scores) == 5


@pytest.mark.parametrize("seed", range(8))
def test_custom_generate_entry_matches_plain_generate(seed):
    model = tiny_model("qwen2")
    case = make_case(model, 700 + seed, VOCAB)
    got = model.generate(
        torch.tensor([case["prompt"]]), custom_generate=lookahead.generate, assistant=LookupDrafter(**case["drafter"]),
        **with_mask(case),
    )
    assert got.tolist() == plain(model, case).tolist()


@pytest.mark.parametrize("tree", [True, False])
def test_trained_model_long_accepts_are_exact(tree):
    model = stories_model()
    prompt = story_prompt(model)
    expected = model.generate(torch.tensor([prompt]), max_new_tokens=60, do_sample=False)
    drafter = LookupDrafter(draft_factor=16, cost_aware=False)
    got = lookahead.generate(model, torch.tensor([prompt]), drafter=drafter, tree=tree, max_new_tokens=60, do_sample=False)
    assert got.tolist() == expected.tolist()
    assert max(drafter.stats.accepted_per_step) >= 8
    assert drafter.stats.tokens >= 60  # our loop sees every step, the last one too


def test_tree_steps_keep_exactly_the_accepted_path_in_the_cache():
    # After generating with trees, the cache must equal a fresh forward pass of the sequence.
    model = stories_model()
    prompt = story_prompt(model)
    trees = []

    class Counting(LookupDrafter):
        def propose_tree(self, *args, **kwargs):
            draft = super().propose_tree(*args, **kwargs)
            trees.append(len(draft) > 1 and bool((draft.parents != np.arange(len(draft)) - 1).any()))  # a real branch
            return draft

    # cost_aware=False: tree sizes would follow this process's timing calibration, and a
    # noisy one can cut every tree to a plain step, leaving nothing to check.
    out = lookahead.generate(model, torch.tensor([prompt]), drafter=Counting(cost_aware=False), tree=True,
                             max_new_tokens=40, do_sample=False, return_dict_in_generate=True)
    assert any(trees)
    cache = cache_of(out)
    kept = cache.get_seq_length()
    assert kept == out.sequences.shape[1] - 1
    with torch.no_grad():
        fresh = model(out.sequences[:, :kept], use_cache=True).past_key_values
    for layer, fresh_layer in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(layer.keys, fresh_layer.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(layer.values, fresh_layer.values, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tree", [True, False])
def test_eos_and_max_new_tokens_inside_an_accepted_block(tree):
    model = stories_model()
    prompt = story_prompt(model)
    for options in (dict(max_new_tokens=40, eos_token_id=prompt[14]), dict(max_new_tokens=7), dict(max_new_tokens=1)):
        options = dict(do_sample=False) | options
        expected = model.generate(torch.tensor([prompt]), **options)
        got = lookahead.generate(model, torch.tensor([prompt]), drafter=LookupDrafter(draft_factor=16), tree=tree, **options)
        assert got.tolist() == expected.tolist(), options


def test_stop_string_completed_inside_an_accepted_block():
    model = stories_model()
    tokenizer = AutoTokenizer.from_pretrained(STORIES)
    prompt = story_prompt(model)
    plain_ids = model.generate(torch.tensor([prompt]), max_new_tokens=60, do_sample=False)[0, len(prompt) :].tolist()
    text = tokenizer.decode(plain_ids)
    stop = text.split()[8]  # a word the model writes again, deep in a long accepted block
    drafter = LookupDrafter(draft_factor=16)
    got = lookahead.generate(model, torch.tensor([prompt]), drafter=drafter, max_new_tokens=60, do_sample=False,
                             stop_strings=stop, tokenizer=tokenizer)
    new = got[0, len(prompt) :].tolist()
    assert new == plain_ids[: len(new)]
    assert stop in tokenizer.decode(new) and stop not in tokenizer.decode(new[:-1])


def test_stop_strings_through_custom_generate_with_the_tokenizer_bound():
    model = stories_model()
    tokenizer = AutoTokenizer.from_pretrained(STORIES)
    prompt = story_prompt(model)
    plain_ids = model.generate(torch.tensor([prompt]), max_new_tokens=60, do_sample=False)[0, len(prompt) :].tolist()
    stop = tokenizer.decode(plain_ids).split()[8]
    options = dict(max_new_tokens=60, do_sample=False, stop_strings=stop)
    direct = lookahead.generate(model, torch.tensor([prompt]), drafter=LookupDrafter(), tokenizer=tokenizer, **options)
    bound = functools.partial(lookahead.generate, tokenizer=tokenizer)
    through = model.generate(torch.tensor([prompt]), custom_generate=bound, assistant=LookupDrafter(), **options)
    assert through.tolist() == direct.tolist()
    assert direct.shape[1] < len(prompt) + 60  # the stop string ended it
    with pytest.raises(ValueError, match="functools.partial"):  # transformers drops tokenizer= on this path
        model.generate(torch.tensor([prompt]), custom_generate=lookahead.generate, assistant=LookupDrafter(), tokenizer=tokenizer, **options)


def long_stop_string(model, tokenizer, prompt, start, tokens):
    """The text of `tokens` plain greedy output tokens from `start` on: a stop string spanning that many."""
    plain_ids = model.generate(torch.tensor([prompt]), max_new_tokens=start + tokens + 20, do_sample=False)[0, len(prompt) :].tolist()
    return tokenizer.decode(plain_ids[start : start + tokens])


@pytest.mark.parametrize("tree", [True, False])
def test_stop_string_spanning_40_tokens_on_both_entry_points(tree):
    # A regression: only the last 32 tokens were decoded, so a longer stop string was never found.
    model = stories_model()
    tokenizer = AutoTokenizer.from_pretrained(STORIES)
    prompt = story_prompt(model)
    stop = long_stop_string(model, tokenizer, prompt, 5, 40)
    options = dict(max_new_tokens=80, do_sample=False, stop_strings=stop)
    expected = model.generate(torch.tensor([prompt]), tokenizer=tokenizer, **options)
    assert expected.shape[1] < len(prompt) + 80  # plain generate stops on it
    direct = lookahead.generate(model, torch.tensor([prompt]), drafter=LookupDrafter(), tree=tree, tokenizer=tokenizer, **options)
    bound = functools.partial(lookahead.generate, tokenizer=tokenizer)
    through = model.generate(torch.tensor([prompt]), custom_generate=bound, assistant=LookupDrafter(), tree=tree, **options)
    assert direct.tolist() == expected.tolist()
    assert through.tolist() == expected.tolist()


@pytest.mark.parametrize("seed", range(4))
def test_stop_strings_of_random_lengths_match_plain_generate(seed):
    # Randomized: stop strings of 1 to 60 tokens from anywhere in the output, one or two of them.
    rng = np.random.default_rng(seed)
    model = stories_model()
    tokenizer = AutoTokenizer.from_pretrained(STORIES)
    prompt = story_prompt(model, length=int(rng.integers(20, 70)), repeat=int(rng.integers(1, 8)))
    stops = [long_stop_string(model, tokenizer, prompt, int(rng.integers(0, 30)), int(rng.integers(1, 61)))
             for _ in range(int(rng.integers(1, 3)))]
    options = dict(max_new_tokens=90, do_sample=False, stop_strings=stops)
    expected = model.generate(torch.tensor([prompt]), tokenizer=tokenizer, **options)
    drafter = LookupDrafter(draft_factor=16, cost_aware=bool(seed % 2))
    got = lookahead.generate(model, torch.tensor([prompt]), drafter=drafter, tree=bool(seed % 3), tokenizer=tokenizer, **options)
    assert got.tolist() == expected.tolist(), stops


def test_streamer_gets_prompt_then_every_new_token():
    model = stories_model()
    prompt = story_prompt(model)
    streamer = Collect()
    out = lookahead.generate(model, torch.tensor([prompt]), drafter=LookupDrafter(), max_new_tokens=30, streamer=streamer, do_sample=False)
    assert streamer.chunks[0] == prompt and streamer.chunks[-1] == "end"
    assert [t for c in streamer.chunks[1:-1] for t in c] == out[0, len(prompt) :].tolist()


def test_tree_support_by_family():
    # Decided by a probe on the live model: every tiny family here takes a 4-D mask and gathers its cache.
    assert [f for f in FAMILIES if tree_support(tiny_model(f)) is None] == TREE_FAMILIES


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda m: lookahead.generate(m, torch.tensor([[5, 6], [7, 8]]), attention_mask=torch.tensor([[1, 0], [1, 1]])),
         UnsupportedGenerationError, "left-padded"),
        (lambda m: lookahead.generate(m, torch.tensor([[5, 6]]), num_beams=2), UnsupportedGenerationError, "beam"),
        (lambda m: lookahead.generate(m, torch.tensor([[5, 6]]), cache_implementation="static"), UnsupportedGenerationError, "static"),
        (lambda m: lookahead.generate(m, torch.tensor([[5, 6, 7]]), attention_mask=torch.tensor([[0, 1, 0]])), UnsupportedGenerationError, "left-padded"),
        (lambda m: lookahead.generate(m, torch.tensor([[5, 6]]), max_new_tokns=3), ValueError, "max_new_tokns"),
        (lambda m: lookahead.generate(m, torch.tensor([[5, 6]]), stop_strings="x"), ValueError, "tokenizer"),
        (lambda m: lookahead.generate(m, torch.tensor([[5, 6]]), return_dict_in_generate=True, output_attentions=True),
         UnsupportedGenerationError, "output_attentions=True"),
        (lambda m: m.generate(torch.tensor([[5, 6]]), custom_generate=lookahead.generate, return_dict_in_generate=True,
                              output_hidden_states=True), UnsupportedGenerationError, "output_hidden_states=True"),
        (lambda m: lookahead.generate(m, [[5, 6]]), TypeError, "torch tensor"),
        (lambda m: lookahead.generate(m, torch.tensor([[5.0, 6.0]], dtype=torch.bfloat16)), TypeError, "dtype torch.bfloat16"),
        (lambda m: lookahead.generate(m, torch.tensor([5, 6])), ValueError, r"shape \(batch, prompt_len\)"),
        (lambda m: lookahead.generate(m, torch.tensor([[5, VOCAB]])), ValueError, f"vocabulary.*{VOCAB}"),
        (lambda m: lookahead.generate(m, torch.tensor([[5, 6]]), do_sample=True, num_return_sequences=2),
         UnsupportedGenerationError, "num_return_sequences=2"),
        (lambda m: m.generate(torch.tensor([[5, 6]]), custom_generate=lookahead.generate, do_sample=True, num_return_sequences=2),
         UnsupportedGenerationError, "num_return_sequences=2"),
        (lambda m: lookahead.generate(m, torch.tensor([[5, 6]]), num_return_sequences=2), ValueError, "num_return_sequences"),
        (lambda m: lookahead.generate(m, torch.tensor([[5, 6]]), drafter="yes"), TypeError, "LookupDrafter instance, got 'yes'"),
        (lambda m: lookahead.generate(m, torch.tensor([[5, 6]]), drafter=LookupDrafter), TypeError, "LookupDrafter instance, got <class"),
        (lambda m: m.generate(torch.tensor([[5, 6]]), custom_generate=lookahead.generate, assistant=LookupDrafter),
         TypeError, "LookupDrafter instance"),
    ],
    ids=["right_padding", "beam", "static_cache", "padding_inside", "typo", "stop_strings_without_tokenizer", "attentions", "hidden_states",
         "list_ids", "bfloat16_ids", "1d_ids", "ids_outside_vocabulary", "num_return_sequences_sampling",
         "num_return_sequences_custom_generate", "num_return_sequences_greedy", "drafter_str", "drafter_class", "assistant_class"],
)
def test_refused_calls(call, error, message):
    with pytest.raises(error, match=message):
        call(tiny_model("llama"))


def test_int32_input_ids_come_back_int64_as_from_plain_generate():
    model = tiny_model("llama")
    input_ids = torch.tensor([[5, 6, 7, 5, 6]], dtype=torch.int32)
    expected = model.generate(input_ids, max_new_tokens=6, do_sample=False)
    got = lookahead.generate(model, input_ids, max_new_tokens=6, do_sample=False)
    assert got.dtype == expected.dtype == torch.int64 and got.tolist() == expected.tolist()


def test_tree_true_on_a_family_without_tree_support():
    # BLOOM's ALiBi reads a 2-D mask: the tree probe's forward raises, and tree=True is refused with why.
    with pytest.raises(UnsupportedGenerationError, match=r"BloomForCausalLM's forward raised .*tree=False"):
        lookahead.generate(families.tiny_model("bloom"), torch.tensor([[5, 6]]), tree=True)


def test_tree_visibility_equals_walking_the_ancestors():
    # A regression: the mask was built by walking every token's ancestors in Python, O(prompt^2)
    # element writes on the first (prefill) step: seconds for a 1,000-token prompt.
    rng = np.random.default_rng(0)
    for _ in range(50):
        u, n = int(rng.integers(1, 6)), int(rng.integers(1, 12))
        draft_parents = np.array([int(rng.integers(-1, i)) for i in range(n)], dtype=np.int64)
        parents = list(range(-1, u - 1)) + [u - 1 if p < 0 else u + p for p in draft_parents.tolist()]
        expected = np.zeros((u + n, u + n), dtype=bool)
        for i in range(u + n):
            j = i
            while j >= 0:
                expected[i, j] = True
                j = parents[j]
        assert np.array_equal(tree_visibility(u, draft_parents), expected)


class FixedLoopCosts(LoopCosts):
    """Costs that learn nothing: verifying up to 64 tokens costs one plain step, trees decided by `tree_over_chain`."""

    def __init__(self, tree_over_chain=None):
        super().__init__(np.full(7, 0.1), tree_over_chain=tree_over_chain)

    def tree_trial(self):  # a chain step's host work is timed: undecided, one-row steps try trees
        return True

    def observe(self, *args, **kwargs):
        pass

    def observe_prefill(self, *args, **kwargs):
        pass


class TreeSpy(LookupDrafter):
    def __init__(self, **options):
        super().__init__(**options)
        self.trees = 0

    def _grow_tree(self, *args, **kwargs):
        self.trees += 1
        return super()._grow_tree(*args, **kwargs)

    def propose_tree(self, *args, **kwargs):
        self.trees += 1
        return super().propose_tree(*args, **kwargs)

    def _likeliest_tree(self, *args, **kwargs):
        self.trees += 1
        return super()._likeliest_tree(*args, **kwargs)


PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]


@pytest.mark.parametrize("over_chain, trees", [(1.02, True), (1.2, False), (None, True)])
def test_default_drafts_trees_only_where_their_steps_cost_what_a_chain_does(monkeypatch, over_chain, trees):
    # None: not known yet, so one-row steps try trees (their times decide, LoopCosts.trees)
    monkeypatch.setattr(generate_module, "loop_costs", lambda model: FixedLoopCosts(over_chain))
    model = tiny_model("llama")
    drafter = TreeSpy()
    got = lookahead.generate(model, torch.tensor([PROMPT]), drafter=drafter, max_new_tokens=12, do_sample=False)
    assert got.tolist() == model.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False).tolist()
    assert (drafter.trees > 0) == trees


def test_unsized_default_drafts_trees_where_the_family_takes_them():
    model = tiny_model("llama")
    drafter = TreeSpy(cost_aware=False)
    got = lookahead.generate(model, torch.tensor([PROMPT]), drafter=drafter, max_new_tokens=12, do_sample=False)
    assert got.tolist() == model.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False).tolist()
    assert drafter.trees > 0


def test_undecided_trees_are_tried_by_one_row_steps_only():
    undecided = FixedLoopCosts()
    assert generate_module.step_trees(None, undecided, rows=1) and not generate_module.step_trees(None, undecided, rows=4)
    assert not generate_module.step_trees(None, LoopCosts(np.full(7, 0.1)), rows=1)  # first a chain step's host work is timed
    assert generate_module.step_trees(None, FixedLoopCosts(1.0), rows=4) and not generate_module.step_trees(None, FixedLoopCosts(2.0), rows=1)
    assert not generate_module.step_trees(False, FixedLoopCosts(1.0), rows=1)


def test_the_whole_output_reaches_memory_the_last_block_included():
    model = stories_model()
    prompt = story_prompt(model)
    store = lookahead.TokenStore()
    drafter = LookupDrafter(memory=store)
    out = lookahead.generate(model, torch.tensor([prompt]), drafter=drafter, max_new_tokens=30, do_sample=False)
    drafter.reset([1])  # files the request into memory
    assert [s.tolist() for s in store.sequences()] == [out[0].tolist()]
