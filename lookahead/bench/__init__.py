"""The `lookahead` command and its benchmarks, on top of the public API.

- `cli`: the `lookahead` entry point (`replay`, `bench`);
- `replay`: model-free τ of a drafter on recorded greedy outputs (traces);
- `e2e`: wall-clock generate() runs, side by side, outputs compared;
- `workloads`: offline workloads and the forced model that writes them;
- `tables`: output formatting.
"""
