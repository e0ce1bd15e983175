"""What a user reads: help(LookupDrafter) and help(lookahead.generate) list what a user calls, in at most 120 lines."""

import pydoc

import lookahead

INTERNAL = ("likeliest_tree", "grow_tree", "record_predictions", "reads_predictions", "transformers_assistant", "_fill_trie",
            "sibling", "exclusive", "functools.partial", "custom_generate=lookahead.generate")
USER_CALLS = {"__init__", "__getattr__", "add_document", "extend", "finish", "propose", "propose_tree", "reset",
              "max_ngram", "min_ngram", "num_tokens", "tokens", "eos_token_ids", "vocab_size", "__dict__", "__weakref__"}


def help_text(thing) -> str:
    return pydoc.render_doc(thing, renderer=pydoc.plaintext)


def test_help_of_lookup_drafter_lists_what_a_user_calls_in_at_most_120_lines():
    text = help_text(lookahead.LookupDrafter)
    assert len(text.splitlines()) <= 120
    listed = {name for name in vars(lookahead.LookupDrafter) if pydoc.visiblename(name, obj=lookahead.LookupDrafter)}
    assert listed <= USER_CALLS, listed - USER_CALLS
    for name in ("config", "device", "generation_config", "generate"):  # transformers' reads: answered, not listed
        assert name not in listed
    assert not [name for name in INTERNAL if name in text]
    assert "nothing is timed up front" in text and "calibrated once" not in text  # cost_aware as the README says it


def test_help_of_generate_recommends_the_three_entry_points_in_at_most_120_lines():
    text = help_text(lookahead.generate)
    assert len(text.splitlines()) <= 120
    assert not [name for name in INTERNAL if name in text]
    for recipe in ("assistant_model=LookupDrafter()", "lookahead.generate(model, input_ids, attention_mask=...",
                   "custom_generate=lookahead.CUSTOM_GENERATE"):
        assert recipe in text


def test_transformers_still_reads_what_it_needs_on_a_drafter():
    drafter = lookahead.LookupDrafter()
    assert drafter.generation_config.num_assistant_tokens == drafter.num_draft_tokens
    assert drafter.config.is_encoder_decoder is False and callable(drafter.generate) and not drafter._supports_logits_to_keep()
    assert not hasattr(drafter, "no_such_name") and not hasattr(lookahead.LookupDrafter, "config")
