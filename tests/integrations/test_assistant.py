"""Streaming, logits processors, reuse and refused options through model.generate(assistant_model=...)."""

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LogitsProcessor, LogitsProcessorList, TextStreamer

from lookahead import LookupDrafter
from tests import cases
from tests.cases import Collect
from tests.models import STORIES, stories_model, tiny_model


def story_prompt(model):
    return torch.tensor([cases.story_prompt(model, length=40, repeat=7)])


def test_streamer_receives_exactly_the_generated_tokens():
    model = stories_model()
    input_ids = story_prompt(model)
    streamer = Collect()
    drafter = LookupDrafter()
    out = model.generate(input_ids, max_new_tokens=30, do_sample=False, assistant_model=drafter, streamer=streamer)
    assert streamer.chunks[-1] == "end"
    streamed = [t for chunk in streamer.chunks[1:-1] for t in chunk]  # chunk 0 is the prompt
    assert streamed == out[0, input_ids.shape[1] :].tolist()
    assert any(len(chunk) > 1 for chunk in streamer.chunks[1:-1]), "no multi-token block was streamed"


def test_text_streamer_prints_the_decoded_text(capsys):
    from transformers import AutoTokenizer

    model = stories_model()
    tokenizer = AutoTokenizer.from_pretrained(STORIES)
    input_ids = story_prompt(model)
    out = model.generate(
        input_ids, max_new_tokens=20, do_sample=False, assistant_model=LookupDrafter(),
        streamer=TextStreamer(tokenizer, skip_prompt=True),
    )
    printed = capsys.readouterr().out
    assert printed.strip() == tokenizer.decode(out[0, input_ids.shape[1] :], skip_special_tokens=True).strip()


class ForbidToken(LogitsProcessor):
    def __init__(self, token_id):
        self.token_id = token_id

    def __call__(self, input_ids, scores):
        scores[:, self.token_id] = float("-inf")
        return scores


@pytest.mark.parametrize(
    "options",
    [
        dict(repetition_penalty=1.5),
        dict(no_repeat_ngram_size=3),
        dict(do_sample=False, top_k=5, top_p=0.5),  # warpers are ignored by greedy; must stay so
    ],
    ids=["repetition_penalty", "no_repeat_ngram", "top_k_top_p_flags"],
)
def test_logits_processors_keep_greedy_exact(options):
    model = stories_model()
    input_ids = story_prompt(model)
    options = dict(max_new_tokens=40, do_sample=False) | options
    assert model.generate(input_ids, assistant_model=LookupDrafter(), **options).tolist() == model.generate(input_ids, **options).tolist()


def test_forbidden_token_processor_keeps_greedy_exact():
    model = stories_model()
    input_ids = story_prompt(model)
    # forbid a token the drafts propose: the drafts are rejected there, the output stays exact
    forbidden = int(input_ids[0, 5])
    processors = LogitsProcessorList([ForbidToken(forbidden)])
    options = dict(max_new_tokens=40, do_sample=False, logits_processor=processors)
    expected = model.generate(input_ids, **options)
    got = model.generate(input_ids, assistant_model=LookupDrafter(), **options)
    assert got.tolist() == expected.tolist()
    assert forbidden not in got[0, input_ids.shape[1] :].tolist()


def test_sampling_with_top_k_and_top_p_runs_and_respects_top_k_1():
    # top_k=1 makes sampling deterministic: it must equal greedy exactly.
    model = stories_model()
    input_ids = story_prompt(model)
    greedy = model.generate(input_ids, max_new_tokens=30, do_sample=False)
    sampled = model.generate(input_ids, max_new_tokens=30, do_sample=True, top_k=1, assistant_model=LookupDrafter())
    assert sampled.tolist() == greedy.tolist()


def test_stats_describe_the_call():
    model = stories_model()
    input_ids = story_prompt(model)
    drafter = LookupDrafter()
    out = model.generate(input_ids, max_new_tokens=30, do_sample=False, assistant_model=drafter)
    stats = drafter.stats
    generated = out.shape[1] - input_ids.shape[1]
    assert stats.accepted > 0
    assert stats.steps < generated
    assert stats.tokens <= generated  # the last step's acceptance is unseen (counted 0)
    assert stats.tau > 1


def test_cost_aware_drafts_are_sized_by_what_the_model_wrote(monkeypatch):
    from lookahead.integrations import calibration
    from lookahead.sizing.cost import SIZES

    model = stories_model()
    input_ids = story_prompt(model)
    # The curve the first draft is priced on is a calibration set here (step_costs seeds from it), not
    # what this process learnt before: on a model this small the steps are near flat, and a curve
    # priced flat by noise rightly drafts the whole chain. Here each extra token costs a tenth of a plain step.
    chain = np.array([1e-3 * (1 + 0.1 * (size - 1)) for size in SIZES])
    monkeypatch.setattr(calibration, "CALIBRATED", {calibration.model_key(model): {"chain": chain}})
    monkeypatch.setattr(calibration, "LEARNT", {})
    sized, unsized = LookupDrafter(), LookupDrafter(cost_aware=False)
    expected = model.generate(input_ids, max_new_tokens=30, do_sample=False)
    for drafter in (sized, unsized):
        assert model.generate(input_ids, max_new_tokens=30, do_sample=False, assistant_model=drafter).tolist() == expected.tolist()
    assert max(unsized.stats.drafted_per_step) > max(sized.stats.drafted_per_step[:1])
    # A fresh sizer starts at a keep rate of 1/2: its first draft is cut below the drafter's full chain.
    assert sized.stats.drafted_per_step[0] < unsized.stats.drafted_per_step[0]


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(num_draft_tokens=0), ValueError, "num_draft_tokens"),
        (dict(min_ngram=3, max_ngram=2), ValueError, "min_ngram=3"),
        (dict(eos_token_id="x"), TypeError, "eos_token_id"),
        (dict(draft_factor=0), ValueError, "draft_factor"),
    ],
)
def test_bad_drafter_options_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        LookupDrafter(**kwargs)


def test_the_class_instead_of_an_instance_is_refused_clearly():
    # A regression: transformers read LookupDrafter.config, a property object: AttributeError on 'get_text_config'.
    model = tiny_model("llama")
    with pytest.raises(TypeError, match=r"assistant_model=LookupDrafter\(\), not the class"):
        model.generate(torch.tensor([[5, 6]]), assistant_model=LookupDrafter, max_new_tokens=3)
    assert not hasattr(LookupDrafter, "config")  # an AttributeError too: introspection sees no attribute


@pytest.mark.parametrize("do_sample", [False, True])
def test_num_return_sequences_is_refused_naming_the_option(do_sample):
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="num_return_sequences"):
        model.generate(torch.tensor([[5, 6]]), assistant_model=LookupDrafter(), max_new_tokens=3, do_sample=do_sample,
                       num_return_sequences=2)


@pytest.mark.parametrize("seed", range(4))
def test_stop_strings_inside_accepted_blocks_stop_where_plain_generate_stops(seed):
    # Randomized: one or two stop strings of 1 to 60 tokens from anywhere in the output.
    rng = np.random.default_rng(seed)
    model = stories_model()
    tokenizer = AutoTokenizer.from_pretrained(STORIES)
    prompt = cases.story_prompt(model, length=int(rng.integers(20, 70)), repeat=int(rng.integers(1, 8)))
    plain_ids = model.generate(torch.tensor([prompt]), max_new_tokens=110, do_sample=False)[0, len(prompt) :].tolist()
    stops = []
    for _ in range(int(rng.integers(1, 3))):
        start = int(rng.integers(0, 30))
        stops.append(tokenizer.decode(plain_ids[start : start + int(rng.integers(1, 61))]))
    options = dict(max_new_tokens=90, do_sample=False, stop_strings=stops, tokenizer=tokenizer)
    expected = model.generate(torch.tensor([prompt]), **options)
    drafter = LookupDrafter(draft_factor=16, cost_aware=bool(seed % 2))
    got = model.generate(torch.tensor([prompt]), assistant_model=drafter, **options)
    assert got.tolist() == expected.tolist(), stops
