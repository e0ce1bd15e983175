"""How well the vLLM engine's per-token keep chances (engine.kernels.token_chances) predict what the traces keep,
and the logistic line behind them refitted.

    python benchmarks/token_chances.py [--traces ../shared/traces] [--requests 60] [--rows 1] [--rule fixed|all]

No vLLM and no model: benchmarks/vllm_proposer.py's runner serves the recorded traces (a prompt and what
Llama-3.1-8B-Instruct wrote) through LookupProposer at --rows rows, the requests in turn, and every chain the
engine drafts is compared with the trace in full (the tokens it would have kept had all been sent), whatever
the sizer sent. --rule fixed: the load rule at F/p 10.7, what the serving bench's engine measured on a 2-core
CPU (the chains of the steps the rule drafts on); --rule all: every chain sent whole (a chain every step).

Prints:
- calibration: per band of the engine's chance, the tokens, the share of them kept and the mean chance;
- the line refitted by logistic regression on the same features as token_chances (1, log(1 + depth),
  logit(frequency), log(1 + occurrences), log(1 + anchor)), per trace file held out (fitted on the other
  two), with the modelled speed over not drafting of the chains sized by each line at one row: a step
  costs --step-cost F,R,T ms (fixed, per row, per drafted token), its draft sized by the one-row load
  rule (sizing.rules.batch_sizes: a token is taken while its chance clears G / (F/T + verified)).
A design aid: the serving bench decides (docs/vllm.md).
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_proposer import Runner, config, load_traces  # noqa: E402

from lookahead.engine.kernels import FREQ_PRIOR, LINE, keep_chance  # noqa: E402
from lookahead.integrations.vllm import LookupProposer  # noqa: E402
from lookahead.sizing.rules import MAX_CHANCE  # noqa: E402

BANDS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.01)


def collect(traces, requests: int, rows: int, rule: str) -> list[dict]:
    """Every chain the engine drafted: its features, chances, and how many of its tokens the trace keeps."""
    options = {"cost_aware": False} if rule == "all" else {"fixed_cost_tokens": 10.7}
    proposer = LookupProposer(config(rows, **options))
    runner = Runner(proposer, rows, traces)
    batch, chains = proposer.batch, []
    while runner.next_trace < rows + requests:
        runner.step(proposer)
        for r in range(rows):
            length, (output, written) = int(batch.out_len[r]), runner.state[r]
            if length == 0 or written >= len(output):
                continue
            room = len(output) - 1 - written  # (the runner's rule: a request's last token is never drafted)
            kept = 0
            while kept < min(length, room) and batch.out_ids[r, kept] == output[written + kept]:
                kept += 1
            key, anchor = runner.input_batch.req_ids[r], int(batch.out_match[r])
            rate = keep_chance(batch.slots.keep, batch.slots.overall, batch.requests[key], anchor)  # (as advance read it)
            chains.append(dict(file=(int(key.split("-")[1]) - 1) % 3, length=min(length, room), kept=kept, anchor=anchor,
                               counts=batch.out_count[r, : length + 1].copy(), chance=batch.out_chance[r, :length].copy(),
                               powers=rate ** np.arange(1, length + 1)))
    return chains


def features(chain: dict) -> np.ndarray:
    """(length, 5): token_chances' features of each token of a chain."""
    counts, length = chain["counts"], chain["length"]
    depth = np.arange(length)
    freq = np.clip((counts[1 : length + 1] + FREQ_PRIOR * chain["powers"][:length]) / (counts[0] + FREQ_PRIOR), 1e-3, 1 - 1e-3)
    return np.stack([np.ones(length), np.log1p(depth), np.log(freq / (1 - freq)), np.full(length, np.log1p(counts[0])),
                     np.full(length, np.log1p(max(chain["anchor"], 1)))], axis=1)


def fit(xs: list, ys: list, l2: float = 1e-2) -> np.ndarray:
    """Logistic regression by Newton's method (a few thousand rows of 5 features)."""
    x, y = np.concatenate(xs), np.concatenate(ys)
    w = np.zeros(x.shape[1])
    for _ in range(40):
        p = 1 / (1 + np.exp(-x @ w))
        w -= np.linalg.solve((x * (p * (1 - p))[:, None]).T @ x + l2 * np.eye(w.shape[0]), x.T @ (p - y) + l2 * w)
    return w


def modelled_speed(chains: list, chances: list, step_cost: tuple) -> float:
    """Tokens per ms over not drafting, each chain sized at one row by the load rule under `chances`."""
    fixed, per_row, per_token = step_cost
    h, tokens, ms = fixed / per_token, 0.0, 0.0
    for chain, p in zip(chains, chances):
        expected, verified, size = 1.0, 1.0, 0
        for pj in np.minimum.accumulate(np.minimum(p, MAX_CHANCE)):
            if pj <= expected / (h + verified):
                break
            expected, verified, size = expected + pj, verified + 1, size + 1
        tokens += 1 + min(size, chain["kept"])
        ms += fixed + per_row + per_token * size
    return tokens / ms * (fixed + per_row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces")
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--rule", choices=("fixed", "all"), default="fixed")
    parser.add_argument("--step-cost", default="6.2,0.45,0.58", help="ms fixed, per decode row, per drafted token")
    args = parser.parse_args()
    step_cost = tuple(float(x) for x in args.step_cost.split(","))
    chains = collect(load_traces(args.traces), args.requests, args.rows, args.rule)
    labels = [(np.arange(c["length"]) < c["kept"]).astype(float) for c in chains]
    print(f"{len(chains)} chains, {sum(c['length'] for c in chains)} tokens, {sum(c['kept'] for c in chains)} kept; "
          f"--rows {args.rows} --rule {args.rule} --requests {args.requests}")
    print("| chance | tokens | kept share | mean chance |\n|---|---|---|---|")
    chance = np.concatenate([c["chance"][: c["length"]] for c in chains])
    kept = np.concatenate(labels)
    for low, high in zip(BANDS, BANDS[1:]):
        band = (chance >= low) & (chance < high)
        if band.any():
            print(f"| {low:.2f}-{min(high, 1.0):.2f} | {band.sum()} | {kept[band].mean():.3f} | {chance[band].mean():.3f} |")
    xs = [features(c) for c in chains]
    print("\n| held out | LINE's modelled speed | refitted line's | refitted line |\n|---|---|---|---|")
    for held in range(3):
        train = [i for i, c in enumerate(chains) if c["file"] != held]
        test = [i for i, c in enumerate(chains) if c["file"] == held]
        if not train or not test:
            continue
        w = fit([xs[i] for i in train], [labels[i] for i in train])
        ours = modelled_speed([chains[i] for i in test], [chains[i]["chance"] for i in test], step_cost)
        refit = modelled_speed([chains[i] for i in test], [1 / (1 + np.exp(-xs[i] @ w)) for i in test], step_cost)
        print(f"| file {held} | {ours:.3f} | {refit:.3f} | {np.round(w, 2).tolist()} |")
    print(f"\nLINE {LINE}; refitted on every file: {np.round(fit(xs, labels), 2).tolist()}")


if __name__ == "__main__":
    main()
