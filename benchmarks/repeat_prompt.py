"""The README's story prompt on stories260K with one drafter, three calls in a fresh process: each
call's seconds and tokens per forward pass (plain: its first call alone). Run each entry in its own
process, taking turns, e.g. three rounds of:

    for e in plain assistant generate; do python benchmarks/repeat_prompt.py $e; done

(from the repository's root; needs ../shared). A busy machine: start busy loops beside it.
"""

import json
import sys
import time

from transformers import AutoModelForCausalLM, AutoTokenizer

import lookahead
from lookahead import LookupDrafter

MODEL = "../shared/models/stories260K"


def main(entry: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL)
    inputs = tokenizer("Once upon a time, there was a little girl named Lily.", return_tensors="pt")
    options = dict(max_new_tokens=200, stop_strings=["The end."], tokenizer=tokenizer)
    drafter, calls = LookupDrafter(), []
    for _ in range(1 if entry == "plain" else 3):
        start = time.perf_counter()
        if entry == "plain":
            model.generate(**inputs, **options)
        elif entry == "assistant":
            model.generate(**inputs, assistant_model=drafter, **options)
        else:
            lookahead.generate(model, inputs["input_ids"], drafter=drafter, **options)
        calls.append((round(time.perf_counter() - start, 3), 1.0 if entry == "plain" else round(drafter.stats.tau, 2)))
    print(json.dumps(dict(entry=entry, calls=calls)))


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("plain", "assistant", "generate"):
        sys.exit("usage: python benchmarks/repeat_prompt.py plain|assistant|generate")
    main(sys.argv[1])
