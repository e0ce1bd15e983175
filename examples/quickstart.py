"""Greedy generation with and without LookupDrafter: same tokens, fewer forward passes.

Runs offline: a random-weight model of a small LLM's shape whose greedy choice is forced to
a real workload's reference output (see lookahead/bench/workloads.py), so every cost is real.

    python examples/quickstart.py                      # code edit of a stdlib file
    python examples/quickstart.py --workload summarize
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

# One short plain call first: torch's one-time costs of a process (thread pools, kernels for
# these shapes), which whichever call came first would pay. Nothing is calibrated: the drafter
# sizes its drafts from the call's own steps (`lookahead bench --cold` times a first call).
with torch.inference_mode():
    model.generate(input_ids[:, -16:], max_new_tokens=4, do_sample=False, pad_token_id=options["pad_token_id"])

results = {}
for name, extra in [("plain greedy", {}), ("LookupDrafter", {"assistant_model": LookupDrafter()})]:
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, **options, **extra)
    seconds = time.perf_counter() - start
    new = out.shape[1] - input_ids.shape[1]
    results[name] = out
    tau = extra["assistant_model"].stats.tau if extra else 1.0
    print(f"{name:14s} {new} tokens in {seconds:.2f} s = {new / seconds:6.1f} tokens/s, {tau:.2f} tokens per forward pass")

assert results["plain greedy"].tolist() == results["LookupDrafter"].tolist(), "outputs differ"
print("identical output:", bpe.decode(results["plain greedy"][0, input_ids.shape[1] : input_ids.shape[1] + 40].tolist()), "...")
