"""Document and memory token ids outside the model's vocabulary never reach the model, on every loop."""

import pytest
import torch

import lookahead
from lookahead import LookupDrafter, TokenStore
from tests.models import VOCAB, tiny_model

OUTSIDE = VOCAB + 903  # 999: an id the tiny models (vocabulary 96) cannot embed


def drafter_with(source: str) -> tuple[LookupDrafter, list[int]]:
    """A drafter whose documents or memory continue the prompt with OUTSIDE, and that prompt."""
    if source == "documents":
        drafter = LookupDrafter(cost_aware=False)
        drafter.add_document([50, 51, 52, OUTSIDE, 53])  # the vocabulary is not known yet: accepted
        return drafter, [1, 2, 3, 50, 51, 52]
    memory = TokenStore()
    memory.add([60, 61, 62, 63, OUTSIDE, 64])  # written for a model with a larger vocabulary
    return LookupDrafter(cost_aware=False, memory=memory), [1, 2, 3, 60, 61, 62]


def run(loop: str, model, prompt: list[int], drafter: LookupDrafter, **options):
    input_ids = torch.tensor([prompt])
    if loop == "transformers":
        return model.generate(input_ids, assistant_model=drafter, **options)
    return lookahead.generate(model, input_ids, drafter=drafter, tree=loop == "engine tree", **options)


LOOPS = ["transformers", "engine chain", "engine tree"]


@pytest.mark.parametrize("source", ["documents", "memory"])
@pytest.mark.parametrize("loop", LOOPS)
def test_greedy_with_out_of_vocabulary_drafts_equals_plain_generate(loop, source):
    # A regression: the drafted id crashed the model's embedding (IndexError deep inside torch).
    model = tiny_model("llama")
    drafter, prompt = drafter_with(source)
    options = dict(max_new_tokens=20, do_sample=False)
    expected = model.generate(torch.tensor([prompt]), **options)
    assert run(loop, model, prompt, drafter, **options).tolist() == expected.tolist()
    assert drafter.vocab_size == VOCAB  # learnt from the loop


@pytest.mark.parametrize("source", ["documents", "memory"])
@pytest.mark.parametrize("loop", LOOPS)
def test_sampling_with_out_of_vocabulary_drafts_runs(loop, source):
    # A regression: transformers' loop crashed building the one-hot proposal, ours in the embedding.
    model = tiny_model("llama")
    drafter, prompt = drafter_with(source)
    torch.manual_seed(0)
    out = run(loop, model, prompt, drafter, max_new_tokens=20, do_sample=True)
    assert out.shape == (1, len(prompt) + 20) and int(out.max()) < VOCAB


def test_add_document_refuses_ids_outside_the_vocabulary_learnt_from_a_call():
    model = tiny_model("llama")
    drafter = LookupDrafter()
    model.generate(torch.tensor([[1, 2, 3]]), assistant_model=drafter, max_new_tokens=2, do_sample=False)
    with pytest.raises(ValueError, match=f"document token id {OUTSIDE} at position 3 .*vocab_size={VOCAB}"):
        drafter.add_document([50, 51, 52, OUTSIDE])
