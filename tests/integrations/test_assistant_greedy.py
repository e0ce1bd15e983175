"""Greedy output with the drafter == greedy output without it, token for token."""

import functools

import pytest
import torch
import transformers

from lookahead import LookupDrafter
from tests.cases import make_case
from tests.models import FAMILIES, VOCAB, stories_model, tiny_model

CASES_PER_FAMILY = 34  # 6 families x 34 = 204 randomized cases, plus the trained model's


# Before transformers 5.2x its assisted loop checks the stopping criteria on the input before the
# first step: a prompt ending in EOS with one new token allowed stops with none (its prompt lookup
# too), where plain generate writes one. No room is left for a draft to mend it.
OLD_LOOP = tuple(int(part) for part in transformers.__version__.split(".")[:2]) < (5, 24)


def old_loop_stops(case) -> bool:
    options = case["options"]
    return OLD_LOOP and options.get("max_new_tokens") == 1 and case["prompt"][-1] == options.get("eos_token_id")


def assert_exact(model, case, drafter=None):
    drafter = drafter or LookupDrafter(**case["drafter"])
    input_ids = torch.tensor([case["prompt"]])
    expected = model.generate(input_ids, **case["options"])
    got = model.generate(input_ids, assistant_model=drafter, **case["options"])
    if old_loop_stops(case) and got.tolist() != expected.tolist():
        pytest.xfail(f"transformers {transformers.__version__}'s assisted loop stops before the first token after a prompt ending in EOS")
    assert got.tolist() == expected.tolist(), case
    return drafter.stats


@functools.cache
def family_case(family: str, seed: int) -> dict:
    """The randomized case `seed` on the tiny `family` (cached: do not mutate it)."""
    return make_case(tiny_model(family), seed, VOCAB)


@functools.cache
def checked_family_case(family: str, seed: int):
    """The drafter's stats of family_case(family, seed), checked exact once: the parametrized test and the guard below
    both need it (a failure is not cached: each asks again and fails)."""
    return assert_exact(tiny_model(family), family_case(family, seed))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", range(CASES_PER_FAMILY))
def test_greedy_matches_plain_generate(family, seed):
    checked_family_case(family, seed)


@pytest.mark.parametrize("seed", range(24))
def test_greedy_matches_plain_generate_on_trained_model(seed):
    model = stories_model()
    assert_exact(model, make_case(model, 1000 + seed, model.config.vocab_size))


def test_cases_exercise_long_accepted_drafts_and_eos_inside_a_draft():
    # Guards the suite itself: the randomized cases must reach the paths that can go wrong.
    longest_accept, accepted, eos_cases = 0, 0, 0
    for family in ("qwen2", "gpt2"):
        for seed in range(CASES_PER_FAMILY):
            case = family_case(family, seed)
            if old_loop_stops(case):
                continue
            stats = checked_family_case(family, seed)  # the parametrized test's run, where it ran
            longest_accept = max([longest_accept, *stats.accepted_per_step])
            accepted += stats.accepted
            eos_cases += "eos_token_id" in case["options"]
    assert longest_accept >= 8
    assert accepted >= 200
    assert eos_cases >= 10


def test_eos_inside_a_long_draft_ends_generation_there():
    model = stories_model()
    prompt = [1] + model.generate(torch.tensor([[1]]), max_new_tokens=30, do_sample=False)[0, 1:].tolist()
    # The model rewrites the story; its 12th token is EOS now: the draft stops before it and
    # the model itself writes it as the bonus token of a long accepted block.
    options = dict(max_new_tokens=40, do_sample=False, eos_token_id=prompt[12])
    case = dict(prompt=prompt + [1], options=options, drafter=dict(num_draft_tokens=16, cost_aware=False))
    stats = assert_exact(model, case)
    assert stats.drafted_per_step[0] >= 11  # the EOS sat inside the first draft


def test_max_new_tokens_ending_mid_draft():
    model = stories_model()
    prompt = [1] + model.generate(torch.tensor([[1]]), max_new_tokens=40, do_sample=False)[0, 1:].tolist()
    for max_new_tokens in (1, 2, 5, 17):
        case = dict(prompt=prompt + [1], options=dict(max_new_tokens=max_new_tokens, do_sample=False), drafter={})
        assert_exact(model, case, LookupDrafter(num_draft_tokens=16, cost_aware=False))


def test_a_drafter_is_reused_across_calls_and_resets_per_call():
    model = stories_model()
    drafter = LookupDrafter()
    for seed in range(6):
        case = make_case(model, 2000 + seed, model.config.vocab_size)
        stats = assert_exact(model, case, drafter)
        # each call starts from fresh stats; tokens never exceed what was generated
        assert stats.tokens <= case["options"]["max_new_tokens"]
