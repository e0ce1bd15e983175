"""The `lookahead` command and its benchmarks, on top of the public API.

- `cli`: the `lookahead` entry point (`replay`, `bench`);
- `replay`: model-free τ of a drafter on recorded greedy outputs (traces);
- `suffix`: vLLM's `suffix` drafter (arctic-inference's SuffixDecodingCache) called as vLLM calls it, and its replay;
- `e2e`: wall-clock generate() runs, side by side, outputs compared;
- `batched`: `bench --batch`, one left-padded batch per size;
- `loop_overhead`: `bench --loop-overhead`, seconds outside the forward per verify step;
- `long_context`: `bench --context`, long prompts made of other requests;
- `timing`: the one timed generate() call (wall clock, time to first token, forwards);
- `traces`: the forced model and its requests (trace files as tasks), below every bench mode;
- `workloads`: offline workloads made from text on this machine;
- `tables`: output formatting.
"""
