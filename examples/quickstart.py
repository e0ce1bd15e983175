"""Plain greedy against LookupDrafter on a code edit, offline: the same tokens, fewer forward passes.

The model here is a stand-in, not a trained model: no trained model can be downloaded offline.
It has random weights in a small LLM's shape (Qwen2, 8 layers, hidden 512, an 8,192-token BPE)
and a logits processor forces its greedy choice to a reference output: for the code edit, a
real standard-library module with one function renamed, as a model following the prompt's
instruction would write it. Every forward pass still runs, so each step costs what a model of
this shape costs; and because the output is fixed, a draft is kept exactly where a model
writing that output would keep it. The speed-up it prints is what such a model would get on
this machine; a real model that wrote something else would keep other drafts. With a network,
the README's quickstart runs the same comparison on a real instruct model.

    python examples/quickstart.py                       # code edit: most of the output copies the prompt
    python examples/quickstart.py --workload summarize  # or chat: less to copy, less to gain

The workloads and the forcing: lookahead/bench/workloads.py.
"""

import argparse
import time

import torch
import transformers
from transformers import LogitsProcessorList

from lookahead import LookupDrafter
from lookahead.bench import workloads

parser = argparse.ArgumentParser()
parser.add_argument("--workload", choices=["code-edit", "summarize", "chat"], default="code-edit")
parser.add_argument("--max-new-tokens", type=int, default=200)
args = parser.parse_args()

bpe = workloads.tokenizer()
pairs = workloads.make_workloads(requests=1)[args.workload]
request = workloads.encode(bpe, pairs, args.max_new_tokens)[0]

torch.manual_seed(0)
config = transformers.Qwen2Config(
    vocab_size=workloads.VOCAB_SIZE, hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
)
model = transformers.AutoModelForCausalLM.from_config(config).eval()
input_ids = torch.tensor([request.prompt])
options = dict(
    max_new_tokens=len(request.reference), do_sample=False, eos_token_id=request.reference[-1],
    pad_token_id=request.reference[-1],
    logits_processor=LogitsProcessorList([workloads.FollowReference(len(request.prompt), request.reference)]),
)

print(
    f"Stand-in model: random weights in a small LLM's shape, forced to write a reference {args.workload} output\n"
    "(no trained model can be downloaded offline; with the output fixed, each draft is kept exactly where a\n"
    "model writing it would keep it, and every forward pass still runs, so the costs are real).\n"
)

# One short call each way first: torch's one-time costs of a process (thread pools, kernels for
# these shapes), which whichever call came first would pay, and, the first time after an install,
# lookahead's compiled kernels (about 10 s, then cached on disk). Nothing is calibrated: the drafter
# sizes its drafts from the call's own steps (`lookahead bench --cold` times a first call).
with torch.inference_mode():
    for warm in ({}, {"assistant_model": LookupDrafter()}):
        model.generate(input_ids, **{**options, "max_new_tokens": 16}, **warm)

results, speed = {}, {}
drafter = LookupDrafter()
for name, extra in [("plain greedy", {}), ("LookupDrafter", {"assistant_model": drafter})]:
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, **options, **extra)
    seconds = time.perf_counter() - start
    new = out.shape[1] - input_ids.shape[1]
    results[name], speed[name] = out, new / seconds
    tau = drafter.stats.tau if extra else 1.0
    print(f"{name:14s} {new} tokens in {seconds:.2f} s = {speed[name]:6.1f} tokens/s, {tau:.2f} tokens per forward pass")

assert results["plain greedy"].tolist() == results["LookupDrafter"].tolist(), "outputs differ"
print(
    f"\nspeed-up {speed['LookupDrafter'] / speed['plain greedy']:.2f}x, {drafter.stats.tau:.2f} tokens per forward pass: each step of the\n"
    "model checked a drafted guess and kept the tokens it would have written anyway; checking a long\n"
    "guess costs more than writing one token, so the speed-up is below the tokens per forward pass."
)

text = bpe.decode(results["plain greedy"][0, input_ids.shape[1] :].tolist()).removeprefix("```python\n")
print("\nthe same output both ways; its first lines:")
for line in text.splitlines()[:6]:
    print("    " + line)
