"""Tree batches of `lookahead.generate` on stories260K: ms outside the forward a step, and steps a call.

Each row's prompt is the model's own 128-token story twice over (lookup finds the continuation), greedy,
`tree=True`, 128 new tokens, one torch thread; three calls after a warm one, every output checked against
plain batched greedy. Unsized by default (`cost_aware=False`: every tree whole, so two commits draft the same
trees and differ only in host time); `sized` sizes them (the steps then follow the step timings). Run from the
repository's root (needs ../shared), commits taking turns:

    python benchmarks/tree_batches.py 4; python benchmarks/tree_batches.py 16 [sized]
"""

import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM

import lookahead
from lookahead import LookupDrafter

MODEL = "../shared/models/stories260K"


def main(rows: int, sized: bool) -> list[dict]:
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(MODEL).eval()
    starts = torch.randint(3, 500, (rows, 8), generator=torch.Generator().manual_seed(0))
    stories = model.generate(starts, attention_mask=torch.ones_like(starts), max_new_tokens=120, do_sample=False, pad_token_id=0)
    ids = torch.cat([stories, stories], dim=1)  # every row the same length: no padding
    mask = torch.ones_like(ids)
    inside = [0.0]
    model.register_forward_pre_hook(lambda module, args: inside.append(time.perf_counter()))
    model.register_forward_hook(lambda module, args, out: inside.__setitem__(0, inside[0] + time.perf_counter() - inside.pop()))
    steps = [0]
    model.register_forward_hook(lambda module, args, out: steps.__setitem__(0, steps[0] + 1))
    drafter = LookupDrafter(cost_aware=sized)
    options = dict(attention_mask=mask, max_new_tokens=128, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **options)
    calls = []
    for call in range(4):
        inside[:], steps[0] = [0.0], 0
        start = time.perf_counter()
        out = lookahead.generate(model, ids, drafter=drafter, tree=True, **options)
        total = time.perf_counter() - start
        assert out.tolist() == expected.tolist(), "not plain batched greedy's output"
        if call:
            calls.append(dict(outside_ms_per_step=round(1e3 * (total - inside[0]) / steps[0], 3), steps=steps[0]))
    return calls


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == "sized")))
