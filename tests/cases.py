"""Shared test inputs: randomized generation cases and a streamer that records what it receives."""

import functools
import random

import torch
from transformers.generation.streamers import BaseStreamer


def make_case(model, seed: int, vocab: int) -> dict:
    """A randomized (prompt, options) case; a third of the prompts repeat the model's own output."""
    rng = random.Random(seed)
    kind = rng.choice(["random", "repeat", "self-repeat"])
    prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 24))]
    if kind == "repeat":
        chunk = prompt[: rng.randint(2, 8)]
        prompt = chunk * rng.randint(2, 5) + prompt
    elif kind == "self-repeat":
        # P + greedy(P) + P: after the second P the model tends to write greedy(P) again,
        # so long drafts are accepted.
        own = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt) :]
        prompt = prompt + own.tolist() + prompt
    options = dict(max_new_tokens=rng.randint(1, 48), do_sample=False)
    if rng.random() < 0.4:
        # An EOS the model really writes, so generation stops inside a block of drafts.
        plain = model.generate(torch.tensor([prompt]), **options)[0, len(prompt) :].tolist()
        options["eos_token_id"] = rng.choice(plain)
    if rng.random() < 0.2:
        options["repetition_penalty"] = 1.3
    if rng.random() < 0.1:
        options["bad_words_ids"] = [[rng.randrange(3, vocab)]]
    drafter = dict(
        num_draft_tokens=rng.choice([1, 3, 10, 16]),
        min_ngram=rng.choice([1, 2]),
        max_ngram=rng.choice([2, 4, 8]),
        draft_factor=rng.choice([1, 3, 16]),
        cost_aware=rng.random() < 0.5,
    )
    return dict(prompt=prompt, options=options, drafter=drafter, kind=kind)


class Collect(BaseStreamer):
    def __init__(self):
        self.chunks = []

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.chunks.append("end")


def story_prompt(model, length: int = 60, repeat: int = 5) -> list[int]:
    """The model's own story from BOS, then its first `repeat` tokens again: the model tends to retell it."""
    story = _story(model, length)
    return story + story[1 : 1 + repeat]


@functools.cache
def _story(model, length: int) -> list[int]:
    """Greedy `length` tokens from BOS, once per model (a cached model: tests/models.py) and length: some thirty tests
    start from the same story. Copied by the caller."""
    return model.generate(torch.tensor([[1]]), max_new_tokens=length, do_sample=False)[0].tolist()
