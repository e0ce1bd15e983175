"""Each transformers frame lookahead reads (lookahead/integrations/hf.py) has a test
here that fails the day transformers renames the function or its locals.

- `_validate_generation_mode` (self, generation_mode, generation_config): the assistant's
  `config` getter refuses beam search, static caches and encoder-decoders there;
- the candidate generator's `__init__` (input_ids, model_kwargs): its `device` getter
  refuses batches and static cache objects there;
- `_assisted_decoding` (stopping_criteria): drafts are cut before a token that completes
  a stop string, which the loop checks on a block's last token only;
- `generate` (streamer): transformers does not forward a streamer to custom_generate.
"""

import pytest
import torch
from transformers import AutoTokenizer

import lookahead
from lookahead import LookupDrafter, UnsupportedGenerationError
from lookahead.integrations.hf import cache_inputs
from tests.cases import Collect, story_prompt
from tests.models import STORIES, stories_model, tiny_model


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(num_beams=2), "beam_search"),
        (dict(num_beams=2, do_sample=True), "beam_sample"),
        (dict(cache_implementation="static"), "cache_implementation='static'"),
    ],
    ids=["beam_search", "beam_sample", "static_cache"],
)
def test_validate_generation_mode_frame_refuses_what_the_loop_cannot_verify(options, message):
    model = tiny_model("llama")
    with pytest.raises(UnsupportedGenerationError, match=message) as error:
        model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=5, assistant_model=LookupDrafter(), **options)
    assert "Call generate once per sequence" in str(error.value)


def test_candidate_generator_frame_refuses_a_batch():
    model = tiny_model("llama")
    input_ids = torch.tensor([[5, 6, 7], [7, 8, 9]])
    with pytest.raises(UnsupportedGenerationError, match="batch has 2") as error:
        model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=5, assistant_model=LookupDrafter())
    assert "lookahead.generate(model, input_ids, attention_mask=..., drafter=" in str(error.value)  # the error names the fix


def test_candidate_generator_frame_refuses_a_static_cache_object():
    from transformers import StaticCache

    model = tiny_model("llama")
    cache = StaticCache(config=model.config, max_cache_len=32)
    # Ours: "StaticCache cannot drop rejected drafts"; before 5.2x transformers refuses first ("Static cache classes").
    with pytest.raises(ValueError, match="Static ?[Cc]ache"):
        # the keyword is `cache` (transformers >= 5.2x) or `past_key_values` (earlier 5.x), as the model's forward names it
        keyword = next(iter(cache_inputs(model, cache)))
        model.generate(torch.tensor([[5, 6, 7]]), **{keyword: cache}, max_new_tokens=5, assistant_model=LookupDrafter())


def test_validate_generation_mode_frame_refuses_encoder_decoders():
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8, decoder_start_token_id=0)).eval()
    with pytest.raises(UnsupportedGenerationError, match="encoder-decoder"):
        model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=5, assistant_model=LookupDrafter())


def test_generate_frame_gives_custom_generate_the_streamer():
    model = stories_model()
    prompt = story_prompt(model)
    streamer = Collect()
    out = model.generate(torch.tensor([prompt]), custom_generate=lookahead.generate, assistant=LookupDrafter(),
                         max_new_tokens=30, do_sample=False, streamer=streamer)
    assert streamer.chunks[0] == prompt and streamer.chunks[-1] == "end"
    assert [t for c in streamer.chunks[1:-1] for t in c] == out[0, len(prompt) :].tolist()


def test_assisted_decoding_frame_gives_the_stop_strings_a_draft_is_cut_before():
    model = stories_model()
    tokenizer = AutoTokenizer.from_pretrained(STORIES)
    prompt = story_prompt(model)
    plain_ids = model.generate(torch.tensor([prompt]), max_new_tokens=60, do_sample=False)[0, len(prompt) :].tolist()
    stop = tokenizer.decode(plain_ids).split()[8]  # a word the model writes again, deep in a long accepted block
    drafter = LookupDrafter(draft_factor=16, cost_aware=False)
    out = model.generate(torch.tensor([prompt]), assistant_model=drafter, max_new_tokens=60, do_sample=False,
                         stop_strings=stop, tokenizer=tokenizer)
    assert [c.stop_strings for c in drafter._transformers_assistant().stop_strings] == [(stop,)]
    new = out[0, len(prompt) :].tolist()
    assert new == plain_ids[: len(new)]
    assert stop in tokenizer.decode(new) and stop not in tokenizer.decode(new[:-1])
