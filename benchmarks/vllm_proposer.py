"""The vLLM proposer's own time per engine step, offline: LookupProposer driven as vLLM's runner drives it.

    python benchmarks/vllm_proposer.py [--traces ../shared/traces] [--rows 1,16,64,256] [--steps 200] [--forward-mb 0]

No vLLM and no model: R rows of recorded traces (../shared/traces: a prompt and what
Llama-3.1-8B-Instruct wrote), held in a persistent batch laid out as vLLM's (token_ids_cpu
(row, position) int32, num_tokens_no_spec, req_ids, num_prompt_tokens, spec_token_ids, the
live requests). Each step the "model" writes what the trace wrote: the drafted tokens that
agree with it and the one after (greedy verification, as the forced target of
benchmarks/vllm_serving.py accepts them); a finished request is replaced by the next trace at
once (continuous batching); between steps the "forward" sleeps --forward-ms (releasing the
GIL, as a model's forward does: the proposer files finished requests into its memory and
indexes the rows' new tokens on a thread meanwhile, timed apart as "thread"), then, with
--forward-mb M, reads and writes M MB (a forward's memory traffic, which leaves the proposer's
data and Python's own out of the caches: the serving bench's forward at 64 rows moves about 165
MB, its output layer's 131 MB of weights and 33 MB of logits; notes/vllm-serving-2026-12.md has what that costs a
step). Printed per row count: the median and mean wall time of `propose` per step (after a
warm-up of --warm steps), its microseconds per row, the proposer's thread's time per step, and
the drafted and accepted tokens, for four load rules:

- `draft-all`: cost_aware=False, every chain sent whole (the most work a step does);
- `rule F/p=64`: the load rule at its prior (what a GPU-like cost lets through);
- `rule F/p=2`: the load rule at this CPU's measured cost (notes/vllm-serving-2026-12.md: 1 to 7), where at
  many rows no drafted token pays and the proposer drafts nothing;
- `rule learnt`: the default, the line and the trust learnt from the time between calls and the drafts (what
  the engine runs); this "forward" takes the same time whatever it verifies, so the line
  learns F/p at its upper bound and drafts go out nearly whole.

With --drafting N, nothing is timed: what each rule drafts and keeps at each row count until N requests
have joined the first rows, beside vLLM's `suffix` (vllm/v1/spec_decode/suffix_decoding.py's
calls to arctic-inference's SuffixDecodingCache, vLLM's defaults; left out where arctic_inference
is not importable), and a modelled speed over not drafting: a step costs --step-cost F,R,T ms (F
fixed, R per decode row, T per drafted token verified; the default is what notes/vllm-serving-2026-12.md fitted for
the serving bench's engine on this CPU; `rule learnt` learns the line and its trust from
those modelled times, each with a lognormal noise of sigma 0.1). A design aid for drafting and sizing,
not a measurement of speed: the serving bench decides.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from lookahead.bench.suffix import SuffixUnavailableError, VllmSuffix, cache_class
from lookahead.integrations.vllm import LookupProposer

ROOT = Path(__file__).resolve().parents[1]
K = 8  # num_speculative_tokens, as in docs/vllm.md's serving bench
MAX_PROMPT = 1024
MAX_TOKENS = 128


def load_traces(folder: Path) -> list[tuple[list, list]]:
    """(prompt, continuation) pairs of every *.dev.jsonl, prompts of at most MAX_PROMPT tokens, the files in turn."""
    per_file = []
    if not any(folder.glob("*.dev.jsonl")):
        raise SystemExit(f"no *.dev.jsonl traces in {folder} (see ../shared/README.md; --traces names another folder)")
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


class SuffixProposer:
    """vLLM 0.32's `suffix` method on this bench's batch, with vLLM's defaults (lookahead.bench.suffix.VllmSuffix:
    vllm/v1/spec_decode/suffix_decoding.py's calls to arctic-inference's SuffixDecodingCache)."""

    def __init__(self):
        self.suffix = VllmSuffix(num_speculative_tokens=K)
        self.batch = None  # the runner's Batch: set by the caller (vLLM hands the proposer its input_batch)

    def load_model(self, *args) -> None:
        pass

    def propose(self, sampled, num_tokens, token_ids) -> list[list[int]]:
        batch = self.batch
        drafts = [self.suffix.propose(batch.req_ids[row], token_ids[row, : batch.num_prompt_tokens[row]], ids,
                                      token_ids[row, : int(num_tokens[row])]).tolist() for row, ids in enumerate(sampled)]
        self.suffix.stop_absent(batch.req_ids)
        return drafts


def drafting(traces, rows: int, requests: int, step_cost: tuple, spread: float = 0.1) -> None:
    """Prints, per rule (and vLLM's `suffix`), what it drafted and kept at `rows` rows until `requests` requests had
    joined the first `rows`, and the modelled speed over not drafting (step_cost: ms fixed, per decode row, per drafted
    token). `rule learnt` learns from the modelled steps' times, each times a lognormal factor of sigma `spread` (an
    engine's steps are not alike: notes/vllm-serving-2026-12.md); the speed is the model's, without that noise."""
    fixed, per_row, per_token = step_cost
    makers = {name: (lambda options=options: LookupProposer(config(rows, **options))) for name, options in RULES.items()}
    makers[f"rule F/p={fixed / per_token:.3g}"] = lambda: LookupProposer(config(rows, fixed_cost_tokens=fixed / per_token))
    try:
        cache_class()
        makers["vLLM suffix"] = SuffixProposer
    except SuffixUnavailableError as e:
        print(f"vLLM suffix: left out. {e}", file=sys.stderr)
    for name, make in makers.items():
        proposer = make()
        runner = Runner(proposer, rows, traces)
        ours = not isinstance(proposer, SuffixProposer)
        if ours:  # the learnt rule reads the modelled step costs as its step times (the others read no time)
            now, noise = [0.0], np.random.default_rng(0)
            proposer.clock = lambda: now[0]
        else:
            proposer.batch = runner.input_batch
        steps, cost, drafts = 0, 0.0, 0
        while runner.next_trace < rows + requests:
            verified = [len(d) for d in runner.drafts]  # what this step verifies (a row starting a request: none)
            step_ms = fixed + per_row * rows + per_token * sum(verified)
            cost += step_ms
            if ours:
                now[0] += step_ms * noise.lognormal(0.0, spread) / 1e3
            drafts += sum(map(bool, verified))
            runner.step(proposer)
            steps += 1
        tokens = steps * rows + runner.accepted
        speed = tokens / cost / (rows / (fixed + per_row * rows))
        rate = runner.accepted / runner.drafted if runner.drafted else 0.0
        print(f"| {rows} | {name} | {steps} | {drafts} | {runner.drafted} | {runner.accepted} | {rate:.2f} | "
              f"{tokens / steps / rows:.3f} | {speed:.3f} |", flush=True)


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
    parser.add_argument("--drafting", type=int, metavar="N",
                        help="time nothing: what each rule drafts and keeps until N requests have joined the first rows")
    parser.add_argument("--step-cost", default="6.2,0.45,0.58", help="with --drafting: a step's ms fixed, per decode row, per "
                        "drafted token (notes/vllm-serving-2026-12.md: the serving bench's engine on a 2-core CPU)")
    args = parser.parse_args()
    traces = load_traces(args.traces)
    if args.drafting:
        try:
            step_cost = tuple(float(x) for x in args.step_cost.split(","))
        except ValueError:
            step_cost = ()
        if len(step_cost) != 3 or min(step_cost) <= 0:
            parser.error(f"--step-cost takes three positive numbers (ms), got {args.step_cost!r}")
        print(f"{args.drafting} requests; K={K}; a step costs {step_cost[0]} + {step_cost[1]} x rows + {step_cost[2]} x "
              "drafted tokens ms (modelled)")
        print("| rows | rule | steps | drafts | drafted | kept | kept / drafted | tokens / step / row | modelled speed over none |")
        print("|---|---|---|---|---|---|---|---|---|")
        for rows in [int(r) for r in args.rows.split(",")]:
            drafting(traces, rows, args.drafting, step_cost)
        return
    print(f"{len(traces)} traces; K={K}; {args.steps} steps after {args.warm}")
    print("| rows | rule | propose ms/step (median) | mean | us/row (mean) | thread ms/step | drafted/step | accepted/drafted |")
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
            worker = proposer.batch.worker  # the proposer's BetweenSteps thread
            threaded = worker.seconds if worker is not None else 0.0
            times = [runner.step(proposer, forward_s, traffic) for _ in range(args.steps)]
            threaded = (worker.seconds - threaded) if worker is not None else float("nan")
            median, mean = statistics.median(times) * 1e3, statistics.mean(times) * 1e3
            rate = runner.accepted / runner.drafted if runner.drafted else 0.0
            print(f"| {rows} | {name} | {median:.3f} | {mean:.3f} | {mean * 1e3 / rows:.1f} | {threaded * 1e3 / args.steps:.3f} | "
                  f"{runner.drafted / args.steps:.1f} | {rate:.2f} |", flush=True)


if __name__ == "__main__":
    main()
