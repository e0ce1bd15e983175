"""Tiny models built from configs (random weights, offline) and the trained stories260K."""

import functools
from pathlib import Path

import pytest
import torch
import transformers

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
STORIES = SHARED / "models" / "stories260K"
VOCAB = 96
EMBEDDING_SCALE = 30.0

# Special ids are set per test (eos_token_id=...); a larger init makes logits peaked like a trained model's.
_SPECIAL = dict(bos_token_id=1, eos_token_id=None, pad_token_id=0, initializer_range=0.3)
_DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, **_SPECIAL)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**_DECODER, num_key_value_heads=2),
    "qwen2": lambda: transformers.Qwen2Config(**_DECODER, num_key_value_heads=2),
    "mistral": lambda: transformers.MistralConfig(**_DECODER, num_key_value_heads=2, sliding_window=None),
    "phi3": lambda: transformers.Phi3Config(**_DECODER, num_key_value_heads=4),
    "gemma": lambda: transformers.GemmaConfig(**_DECODER, num_key_value_heads=1, head_dim=8),
    "gpt2": lambda: transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=512, **_SPECIAL),
}
FAMILIES = list(CONFIGS)


@functools.cache
def tiny_model(family: str):
    """A random-weight model of `family`, the same on every call (cached: do not mutate it)."""
    torch.manual_seed(FAMILIES.index(family))
    config = CONFIGS[family]()
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    # Large embeddings dominate the residual stream, so the next token depends mostly on
    # the current one: greedy output falls into cycles, as a trained model's copies do, and
    # drafts get long acceptances (the paths exactness can break on). Attention still mixes context.
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(EMBEDDING_SCALE)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


@functools.cache
def stories_model():
    if not STORIES.is_dir():
        pytest.skip(f"{STORIES} is absent (../shared is not laid out beside the project)")
    model = transformers.AutoModelForCausalLM.from_pretrained(STORIES).eval()
    model.generation_config.pad_token_id = 0
    return model
