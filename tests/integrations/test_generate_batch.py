"""Batches in lookahead.generate: every row equals plain batched generate on the same left-padded batch."""

import random

import pytest
import torch
from transformers import AutoTokenizer

import lookahead
from lookahead import LookupDrafter, UnsupportedGenerationError
from lookahead.integrations import batch_drafts
from lookahead.integrations import generate as generate_module
from lookahead.sizing.cost import LineCost
from tests.cases import make_case, story_prompt
from tests.models import FAMILIES, STORIES, VOCAB, stories_model, tiny_model

TREE_FAMILIES = FAMILIES  # each passes the tree probe (integrations.support.tree_support)
CASES = 8
PAD = 0


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) as a tokenizer pads for generation (padding_side='left')."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def batch_case(model, seed: int) -> dict:
    """Ragged prompts (a third repeat the model's own output), rows ending at different times (an EOS the model
    writes in one row), sometimes a repetition penalty, a forbidden token or no repeated 3-grams; random drafter options."""
    rng = random.Random(seed)
    prompts = [make_case(model, seed * 10 + i, VOCAB)["prompt"] for i in range(rng.randint(2, 5))]
    ids, mask = left_padded(prompts)
    options = dict(max_new_tokens=rng.randint(1, 40), do_sample=False)
    if rng.random() < 0.3:
        options["repetition_penalty"] = 1.3
    if rng.random() < 0.15:
        options["bad_words_ids"] = [[rng.randrange(3, VOCAB)]]
    if rng.random() < 0.15:
        options["no_repeat_ngram_size"] = 3
    if rng.random() < 0.6:
        plain = model.generate(ids, attention_mask=mask, **options)[:, ids.shape[1] :]
        options["eos_token_id"] = int(rng.choice(plain[rng.randrange(len(prompts))].tolist()))
    drafter = dict(num_draft_tokens=rng.choice([3, 10, 16, 64]), min_ngram=rng.choice([1, 2]), max_ngram=rng.choice([2, 4, 8]),
                   draft_factor=rng.choice([3, 16]), cost_aware=rng.random() < 0.5)
    return dict(ids=ids, mask=mask, options=options, drafter=drafter)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", range(CASES))
def test_batch_greedy_matches_plain_batched_generate(family, seed):
    model = tiny_model(family)
    case = batch_case(model, 900 + seed)
    expected = model.generate(case["ids"], attention_mask=case["mask"], **case["options"])
    for tree in ([True, False] if family in TREE_FAMILIES else [False]):
        drafter = LookupDrafter(**case["drafter"])
        got = lookahead.generate(model, case["ids"], attention_mask=case["mask"], drafter=drafter, tree=tree, **case["options"])
        assert got.dtype == torch.int64 and got.tolist() == expected.tolist(), (tree, case)


@pytest.mark.parametrize("seed", range(4))
def test_batch_through_custom_generate_matches_plain(seed):
    model = tiny_model("qwen2")
    case = batch_case(model, 950 + seed)
    got = model.generate(case["ids"], attention_mask=case["mask"], custom_generate=lookahead.generate,
                         assistant=LookupDrafter(**case["drafter"]), **case["options"])
    assert got.tolist() == model.generate(case["ids"], attention_mask=case["mask"], **case["options"]).tolist()


def story_batch(model, shapes=((60, 5), (30, 3), (45, 8), (20, 2))):
    return left_padded([story_prompt(model, length=length, repeat=repeat) for length, repeat in shapes])


@pytest.mark.parametrize("tree", [True, False])
def test_trained_model_batch_long_accepts_eos_inside_drafts_rows_ending_apart(tree):
    model = stories_model()
    ids, mask = story_batch(model)
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=50, do_sample=False)[:, ids.shape[1] :]
    for options in (dict(max_new_tokens=50), dict(max_new_tokens=50, eos_token_id=int(plain[0, 20])),
                    dict(max_new_tokens=50, eos_token_id=int(plain[2, 7]), repetition_penalty=1.2), dict(max_new_tokens=1)):
        options = dict(do_sample=False) | options
        expected = model.generate(ids, attention_mask=mask, **options)
        drafter = LookupDrafter(cost_aware=False)
        got = lookahead.generate(model, ids, attention_mask=mask, drafter=drafter, tree=tree, **options)
        assert got.tolist() == expected.tolist(), options
        if options == dict(do_sample=False, max_new_tokens=50):  # no EOS, no penalty: the rows retell their stories
            assert max(drafter.stats.accepted_per_step) >= 8  # long blocks were accepted in a row


def test_rows_end_at_different_times_and_finished_rows_leave_the_block():
    model = tiny_model("llama")
    rng = random.Random(3)
    ids, mask = left_padded([[rng.randrange(3, VOCAB) for _ in range(length)] for length in (12, 5, 9, 16)])
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False)[:, ids.shape[1] :]
    # an EOS one row writes early and the others never: that row ends, the others go on
    eos, row = next((int(plain[r, p]), r) for p in range(1, 10) for r in range(4)
                    if all(int(plain[r, p]) not in plain[other].tolist() for other in range(4) if other != r))
    options = dict(max_new_tokens=40, do_sample=False, eos_token_id=eos)
    expected = model.generate(ids, attention_mask=mask, **options)
    lengths = ((expected[:, ids.shape[1] :] != PAD) | (torch.arange(expected.shape[1] - ids.shape[1]) == 0)).sum(dim=1)
    assert len(set(lengths.tolist())) > 1, "the case must end rows at different times"
    rows_seen = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: rows_seen.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    try:
        # tree=False, cost_aware=False: no calibration (one-row forwards) inside the watched call
        got = lookahead.generate(model, ids, attention_mask=mask, drafter=LookupDrafter(num_draft_tokens=2, cost_aware=False),
                                 tree=False, **options)
    finally:
        hook.remove()
    assert got.tolist() == expected.tolist()
    assert rows_seen[0] == 4 and rows_seen == sorted(rows_seen, reverse=True)  # rows leave, none comes back
    assert sum(rows < 4 for rows in rows_seen) >= 5  # the ended row left the block for the rest of the call


def test_stop_strings_end_each_row_where_plain_generate_does():
    model = stories_model()
    tokenizer = AutoTokenizer.from_pretrained(STORIES)
    ids, mask = story_batch(model)
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=60, do_sample=False)[:, ids.shape[1] :]
    stops = [tokenizer.decode(plain[0].tolist()).split()[6], tokenizer.decode(plain[3].tolist()).split()[3]]
    options = dict(max_new_tokens=60, do_sample=False, stop_strings=stops)
    expected = model.generate(ids, attention_mask=mask, tokenizer=tokenizer, **options)
    assert (expected[:, ids.shape[1] :] == PAD).any()  # some row stopped early, padded
    for tree in (True, False):
        got = lookahead.generate(model, ids, attention_mask=mask, drafter=LookupDrafter(), tree=tree, tokenizer=tokenizer, **options)
        assert got.tolist() == expected.tolist(), tree


def test_one_left_padded_row_drafts_as_a_batch_row_and_one_unpadded_row_with_the_callers_drafter():
    model = tiny_model("llama")
    ids, mask = left_padded([[5, 6, 7, 5, 6, 7, 5], [9, 10, 9, 10]])
    drafter = LookupDrafter()
    padded = lookahead.generate(model, ids[1:], attention_mask=mask[1:], drafter=drafter, max_new_tokens=12, do_sample=False)
    assert padded.tolist() == model.generate(ids[1:], attention_mask=mask[1:], max_new_tokens=12, do_sample=False).tolist()
    assert len(drafter.index) == 0 and drafter.memory.num_sequences == 1  # a batch row: filed into memory when it ended
    one = torch.tensor([[5, 6, 7, 5, 6, 7, 5]])
    got = lookahead.generate(model, one, drafter=drafter, max_new_tokens=12, do_sample=False)
    assert got.tolist() == model.generate(one, max_new_tokens=12, do_sample=False).tolist()
    assert drafter.index.tokens.tolist() == got[0].tolist()  # one row: the caller's drafter holds the request


def test_rows_share_memory_and_documents_and_stats_fold_into_the_drafter():
    model = stories_model()
    ids, mask = story_batch(model)
    drafter = LookupDrafter(cost_aware=False)
    drafter.reset([7, 8, 9])  # an earlier request: filed into memory when the batch starts
    out = lookahead.generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=30, do_sample=False)
    real = int(mask.sum()) + out.shape[0] * 30
    assert drafter.memory.num_sequences == 1 + 4
    assert len(drafter.memory) == 3 + real + 5  # every row's prompt and whole output, a separator after each sequence
    assert drafter.stats.tokens >= 4 * 30 and drafter.stats.accepted > 0
    assert len(drafter.index) == 0  # the batch's rows were filed; nothing of theirs waits in the drafter
    # a later request copies a row's output from memory
    again = LookupDrafter(memory=drafter.memory, cost_aware=False)
    prompt = out[0, mask.shape[1] - int(mask[0].sum()) :].tolist()[:-20]
    lookahead.generate(model, torch.tensor([prompt]), drafter=again, max_new_tokens=15, do_sample=False)
    assert again.stats.accepted >= 10


@pytest.mark.parametrize(
    "options, error, message",
    [
        (dict(streamer=object()), UnsupportedGenerationError, "streaming a batch"),
        (dict(return_dict_in_generate=True, output_scores=True), UnsupportedGenerationError, "scores and logits"),
    ],
    ids=["streamer", "scores"],
)
def test_refused_batch_calls(options, error, message):
    ids, mask = left_padded([[5, 6, 7], [8, 9]])
    with pytest.raises(error, match=message):
        lookahead.generate(tiny_model("llama"), ids, attention_mask=mask, max_new_tokens=4, **options)


def test_stop_strings_without_any_pad_or_eos_id_are_refused_for_a_batch():
    # Plain generate keeps writing a row its stop string ended when it has no pad id; we would pad it: refused.
    model = stories_model()
    tokenizer = AutoTokenizer.from_pretrained(STORIES)
    ids, mask = left_padded([[1, 5, 6, 7], [1, 8, 9]])
    with pytest.raises(ValueError, match="pad_token_id"):
        lookahead.generate(model, ids, attention_mask=mask, max_new_tokens=4, stop_strings="x", tokenizer=tokenizer,
                           pad_token_id=None, eos_token_id=None)


def test_return_dict_in_generate_holds_the_sequences():
    model = tiny_model("llama")
    ids, mask = left_padded([[5, 6, 7], [8, 9]])
    got = lookahead.generate(model, ids, attention_mask=mask, max_new_tokens=5, return_dict_in_generate=True)
    assert got.sequences.tolist() == model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False).tolist()


class FixedCosts:
    """The loop's costs with F / p fixed at 8 for every row count: its sizing, free of this machine's timings."""

    def __init__(self, model=None):
        self.line = LineCost(8.0)

    def at(self, rows):
        return self.line

    def observe(self, rows, width, seconds, *, tree=False, host=0.0, gain=1.0):
        pass

    def observe_prefill(self, rows, tokens, seconds):
        pass

    def trees(self):
        return False


def test_drafts_shrink_as_the_batch_grows(monkeypatch):
    # The same two stories at 2 rows and copied to 16: a column costs 16 tokens instead of 2, so
    # the loop verifies fewer drafted tokens per row; every output stays exact.
    monkeypatch.setattr(generate_module, "loop_costs", FixedCosts)
    model = stories_model()
    prompts = [story_prompt(model, length=60, repeat=5), story_prompt(model, length=30, repeat=3)]
    drafted = {}
    for rows in (2, 16):
        ids, mask = left_padded(prompts * (rows // 2))
        drafter = LookupDrafter()  # cost-aware: sized by static_batch_draft_sizes
        got = lookahead.generate(model, ids, attention_mask=mask, drafter=drafter, tree=False, max_new_tokens=40, do_sample=False)
        assert got.tolist() == model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False).tolist()
        drafted[rows] = drafter.stats.drafted / drafter.stats.steps  # per row and step
    assert drafted[2] > 1.5 * drafted[16] and drafted[2] >= 1  # measured: 1.6 against 0.7


def test_the_load_rule_sees_each_rows_remaining_tokens_and_rate_and_the_prefill_drafts_nothing(monkeypatch):
    monkeypatch.setattr(generate_module, "loop_costs", FixedCosts)
    seen = []
    original = batch_drafts.static_batch_draft_sizes

    def sizes(chances, lengths, remaining, rates, *, cost):
        seen.append((list(remaining), list(rates)))
        return original(chances, lengths, remaining, rates, cost=cost)

    monkeypatch.setattr(batch_drafts, "static_batch_draft_sizes", sizes)
    model = stories_model()
    prompts = [story_prompt(model, length=60, repeat=5), story_prompt(model, length=30, repeat=3)]
    ids, mask = left_padded(prompts)
    drafter = LookupDrafter()
    got = lookahead.generate(model, ids, attention_mask=mask, drafter=drafter, tree=False, max_new_tokens=40, do_sample=False)
    assert got.tolist() == model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False).tolist()
    # the stats hold row 0's steps, then row 1's: each row's first step (the prefill) verified no draft
    stats, first_of_row, written = drafter.stats, [0], 0
    for step, accepted in enumerate(stats.accepted_per_step):
        written += accepted + 1
        if written >= 40 and len(first_of_row) == 1:
            first_of_row.append(step + 1)
    assert [stats.drafted_per_step[i] for i in first_of_row] == [0, 0] and stats.accepted > 0  # later steps kept some
    assert seen[0] == ([39, 39], [1.0, 1.0])  # after the prefill's token: 39 to go, one token per step so far
    for remaining, rates in seen:
        for left, rate in zip(remaining, rates):
            assert 1.0 <= rate <= 40 - left and left >= 1  # no more tokens per step than the row has written
    assert any(rate > 1.5 for _, rates in seen for rate in rates)  # kept drafts raise a row's rate
