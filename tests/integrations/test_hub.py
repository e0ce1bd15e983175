"""transformers' custom_generate layout: `model.generate(..., assistant=LookupDrafter())` from a folder, exact."""

import shutil

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from lookahead import LookupDrafter
from lookahead.integrations import hub
from tests.cases import Collect, story_prompt
from tests.models import STORIES, stories_model, tiny_model


def test_a_custom_generate_folder_runs_our_loop_exactly_with_stop_strings_and_a_streamer():
    model = stories_model()
    tokenizer = AutoTokenizer.from_pretrained(STORIES)
    prompt = torch.tensor([story_prompt(model)])
    options = dict(max_new_tokens=60, do_sample=False, stop_strings=["."], tokenizer=tokenizer)
    expected = model.generate(prompt, **options)
    ours, streamer = Collect(), Collect()
    drafter = LookupDrafter()
    got = model.generate(prompt, custom_generate=hub.FOLDER, trust_remote_code=True, assistant=drafter, streamer=ours, **options)
    model.generate(prompt, streamer=streamer, **options)
    assert got.tolist() == expected.tolist()
    assert expected.shape[1] < prompt.shape[1] + 60  # the stop string ended it
    assert sum(ours.chunks[1:-1], []) == sum(streamer.chunks[1:-1], []) == expected[0, prompt.shape[1] :].tolist()
    assert drafter.stats.steps > 0 and drafter.stats.tau > 1  # our loop ran, and its drafts were kept


def test_a_custom_generate_folder_needs_trust_remote_code():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="trust_remote_code"):
        model.generate(torch.tensor([[5, 6, 7]]), custom_generate=hub.FOLDER, trust_remote_code=False, assistant=LookupDrafter(),
                       max_new_tokens=4)


@pytest.mark.parametrize("source", ["stories260K", "llama", "gpt2"])
def test_a_model_folder_carrying_custom_generate_generates_with_assistant(tmp_path, source):
    if source == "stories260K":
        stories_model()  # skips where ../shared is absent
        folder = shutil.copytree(STORIES, tmp_path / "model")
        reference = AutoModelForCausalLM.from_pretrained(folder).eval()
        prompt = torch.tensor([story_prompt(reference)])
    else:
        reference = tiny_model(source)
        reference.save_pretrained(folder := tmp_path / "model")
        prompt = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    written = hub.write_custom_generate(folder)
    assert sorted(p.name for p in written.iterdir()) == ["README.md", "generate.py", "requirements.txt"]
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    options = dict(max_new_tokens=40, do_sample=False, pad_token_id=0)
    expected = reference.generate(prompt, **options)
    drafter = LookupDrafter()
    assert model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), assistant=drafter, **options).tolist() == expected.tolist()
    assert drafter.stats.steps > 0  # our loop ran
    assert model.generate(prompt, **options).tolist() == expected.tolist()  # without assistant=: transformers' own generate
    assert model.generate(prompt, assistant_model=LookupDrafter(), **options).tolist() == expected.tolist()  # the assisted loop still works
    plain = AutoModelForCausalLM.from_pretrained(folder).eval()  # without trust_remote_code: transformers' generate, untouched
    assert plain.generate.__func__ is transformers.GenerationMixin.generate or type(plain).generate is plain.generate.__func__


def test_write_custom_generate_refuses_a_missing_folder(tmp_path):
    with pytest.raises(NotADirectoryError, match="existing folder"):
        hub.write_custom_generate(tmp_path / "absent")
