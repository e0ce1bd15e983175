"""The vLLM proposer's own time per engine step, offline: LookupProposer driven as vLLM's runner drives it.

    python benchmarks/vllm_proposer.py [--traces ../shared/traces] [--rows 1,16,64,256] [--steps 200] [--forward-mb 0]

No vLLM and no model: R rows of recorded traces (../shared/traces: a prompt and what
Llama-3.1-8B-Instruct wrote), held in a persistent batch laid out as vLLM's (token_ids_cpu
(row, position) int32, num_tokens_no_spec, req_ids, num_prompt_tokens, spec_token_ids, the
live requests). Each step the "model" writes what the trace wrote: the drafted tokens that
agree with it and the one after (greedy verification, as the forced target of
examples/vllm_serving.py accepts them); a finished request is replaced by the next trace at
once (continuous batching); between steps the "forward" sleeps --forward-ms (releasing the
GIL, as a model's forward does: the proposer files finished requests into its memory on a
thread meanwhile, timed apart as "filing"), then, with --forward-mb M, reads and writes M MB
(a forward's memory traffic, which leaves the proposer's data and Python's own out of the
caches: the serving bench's forward at 64 rows moves about 165 MB, its output layer's 131 MB
of weights and 33 MB of logits; docs/vllm.md has what that costs a step). Printed per row count: the median and mean wall
time of `propose` per step (after a warm-up of --warm steps), its microseconds per row, the
filing thread's time per step, and the drafted and accepted tokens, for four load rules:

- `draft-all`: cost_aware=False, every chain sent whole (the most work a step does);
- `rule F/p=64`: the load rule at its prior (what a GPU-like cost lets through);
- `rule F/p=2`: the load rule at this CPU's measured cost (docs/vllm.md: 1 to 7), where at
  many rows no drafted token pays and the proposer drafts nothing;
- `rule learnt`: the default, the line and the gate learnt from the time between calls (what
  the engine runs); this "forward" takes the same time whatever it verifies, so the line
  learns F/p at its upper bound and drafts go out nearly whole.
"""

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from lookahead.integrations.vllm import LookupProposer

ROOT = Path(__file__).resolve().parents[1]
K = 8  # num_speculative_tokens, as in docs/vllm.md's serving bench
MAX_PROMPT = 1024
MAX_TOKENS = 128


def load_traces(folder: Path) -> list[tuple[list, list]]:
    """(prompt, continuation) pairs of every *.dev.jsonl, prompts of at most MAX_PROMPT tokens, the files in turn."""
    per_file = []
    for path in sorted(folder.glob("*.dev.jsonl")):
        pairs = []
        for line in path.read_text().splitlines():
            record = json.loads(line)
            prompt, output = record["prompt_token_ids"], record["generated_token_ids"][:MAX_TOKENS]
            if len(prompt) <= MAX_PROMPT and len(output) >= 2:
                pairs.append((prompt, output))
        per_file.append(pairs)
    return [pairs[i] for i in range(max(map(len, per_file))) for pairs in per_file if i < len(pairs)]


class Batch:
    """vLLM's persistent batch (gpu_input_batch.InputBatch's fields that the proposer reads)."""

    def __init__(self, rows: int):
        self.token_ids_cpu = np.zeros((rows, MAX_PROMPT + MAX_TOKENS + K + 1), dtype=np.int32)  # (row, position)
        self.num_tokens_no_spec = np.zeros(rows, dtype=np.int32)  # (row,)
        self.num_prompt_tokens = np.zeros(rows, dtype=np.int32)  # (row,)
        self.req_ids: list = [None] * rows
        self.spec_token_ids: list = [[] for _ in range(rows)]


class Runner:
    """Drives a proposer over `rows` rows of traces; the proposer finds it on load_model's stack."""

    def __init__(self, proposer, rows: int, traces):
        self.input_batch = Batch(rows)
        self.requests: dict = {}
        self.traces, self.next_trace, self.serial = traces, 0, 0
        self.state = [None] * rows  # (row,) [trace continuation, tokens written]
        self.drafts = [[] for _ in range(rows)]
        self.drafted = self.accepted = 0
        proposer.load_model(object())
        for row in range(rows):
            self._start(row)

    def _start(self, row: int) -> None:
        prompt, output = self.traces[self.next_trace % len(self.traces)]
        self.next_trace += 1
        self.serial += 1
        batch = self.input_batch
        req_id = f"req-{self.serial}"
        if batch.req_ids[row] is not None:
            del self.requests[batch.req_ids[row]]
        batch.req_ids[row] = req_id
        self.requests[req_id] = None
        batch.token_ids_cpu[row, : len(prompt)] = prompt
        batch.token_ids_cpu[row, len(prompt)] = output[0]  # the prefill's token
        batch.num_tokens_no_spec[row] = len(prompt) + 1
        batch.num_prompt_tokens[row] = len(prompt)
        self.state[row] = [output, 1]
        self.drafts[row] = []

    def step(self, proposer, forward_s: float = 0.0, traffic: np.ndarray | None = None) -> float:
        """One engine step: every row verifies its draft against its trace; returns propose's seconds.
        traffic: a buffer the "forward" reads and writes after its sleep (None: none)."""
        batch = self.input_batch
        sampled = []
        for row, draft in enumerate(self.drafts):
            output, written = self.state[row]
            if written >= len(output):
                self._start(row)
                sampled.append([int(self.state[row][0][0])])
                batch.spec_token_ids[row] = []
                continue
            kept = 0
            while kept < len(draft) and written + kept < len(output) - 1 and draft[kept] == output[written + kept]:
                kept += 1
            new = output[written : written + kept + 1]
            n = int(batch.num_tokens_no_spec[row])
            batch.token_ids_cpu[row, n : n + len(new)] = new
            batch.num_tokens_no_spec[row] = n + len(new)
            batch.spec_token_ids[row] = list(draft)
            self.state[row][1] = written + len(new)
            self.drafted += len(draft)
            self.accepted += kept
            sampled.append(list(new))
        time.sleep(forward_s)
        if traffic is not None:
            traffic += 1
        start = time.perf_counter()
        self.drafts = proposer.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)
        return time.perf_counter() - start


def config(rows: int, **options):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K),
        model_config=SimpleNamespace(max_model_len=MAX_PROMPT + MAX_TOKENS + K + 1, hf_config=SimpleNamespace(eos_token_id=None)),
        scheduler_config=SimpleNamespace(max_num_seqs=rows), additional_config={"lookahead": options})


RULES = {"draft-all": {"cost_aware": False}, "rule F/p=64": {"fixed_cost_tokens": 64.0}, "rule F/p=2": {"fixed_cost_tokens": 2.0},
         "rule learnt": {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--rows", default="1,16,64,256")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warm", type=int, default=20)
    parser.add_argument("--forward-ms", type=float, default=2.0)
    parser.add_argument("--forward-mb", type=float, default=0.0, help="MB the forward reads and writes (0: none)")
    args = parser.parse_args()
    traces = load_traces(args.traces)
    print(f"{len(traces)} traces; K={K}; {args.steps} steps after {args.warm}")
    print("| rows | rule | propose ms/step (median) | mean | us/row (mean) | filing ms/step | drafted/step | accepted/drafted |")
    print("|---|---|---|---|---|---|---|---|")
    for rows in [int(r) for r in args.rows.split(",")]:
        for name, options in RULES.items():
            proposer = LookupProposer(config(rows, **options))
            runner = Runner(proposer, rows, traces)
            forward_s = args.forward_ms / 1e3
            traffic = np.zeros(int(args.forward_mb * (1 << 20)) // 4, np.float32) if args.forward_mb else None
            for _ in range(args.warm):
                runner.step(proposer, forward_s, traffic)
            runner.drafted = runner.accepted = 0
            filing = getattr(proposer, "_filing", None)  # (older proposers file at once)
            filed = filing.seconds if filing is not None else 0.0
            times = [runner.step(proposer, forward_s, traffic) for _ in range(args.steps)]
            filed = (filing.seconds - filed) if filing is not None else float("nan")
            median, mean = statistics.median(times) * 1e3, statistics.mean(times) * 1e3
            rate = runner.accepted / runner.drafted if runner.drafted else 0.0
            print(f"| {rows} | {name} | {median:.3f} | {mean:.3f} | {mean * 1e3 / rows:.1f} | {filed * 1e3 / args.steps:.3f} | "
                  f"{runner.drafted / args.steps:.1f} | {rate:.2f} |", flush=True)


if __name__ == "__main__":
    main()
