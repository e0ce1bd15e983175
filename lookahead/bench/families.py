"""Every decoder-only causal-LM family of the installed transformers, through every entry point.

Run: `OMP_NUM_THREADS=1 nice -n 19 python -m lookahead.bench.families [--json] [--only llama,gpt2]`

Each family of `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` is built from its config class with small
sizes (tiny_config: 2 layers, 4 heads, hidden 64, vocabulary 256, sliding windows of 8, ...),
random weights with a fixed seed and scaled-up embeddings (greedy output falls into cycles, so
drafts are accepted), and a repetitive 24-token prompt longer than the window. Then 24 greedy
tokens through each path, each compared with plain greedy:

- `pld`: transformers' own prompt lookup (prompt_lookup_num_tokens=), for reference;
- `assistant`: model.generate(..., assistant_model=LookupDrafter());
- `chain` / `tree`: lookahead.generate(model, ids, tree=False / tree=True).

Outcomes: `exact`, `refused` (our UnsupportedGenerationError, with its reason), `refused by
transformers` (its own refusal of stateful models, before any forward pass), `DIFFERENT`
(another token sequence), `CRASHED` (any other exception). A family whose tiny model cannot be
built or cannot run plain greedy is skipped as transformers' own fault, with the reason.
"""

import argparse
import dataclasses
import json
import os
import re
import sys
import time
import warnings
import zlib
from collections import Counter

import torch
import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import lookahead
from lookahead import LookupDrafter, UnsupportedGenerationError
from lookahead.bench.tables import format_table

VOCAB = 256
WINDOW = 8  # sliding windows, attention chunks: shorter than the prompt, so every path runs past them
NEW_TOKENS = 24
EMBEDDING_SCALE = 30.0  # as tests/models.py: the next token depends mostly on the current one
MAX_PARAMETERS = 5_000_000
# transformers' own refusal of assisted generation on a stateful model, raised in _validate_generation_mode
# before it reads anything of the assistant, so assistant_model= cannot refuse first with our error.
TRANSFORMERS_REFUSAL = "assisted generation is not supported with stateful models"
PATHS = ("pld", "assistant", "chain", "tree")

# Small values for every size attribute a config class may have; only the fields the class
# declares are passed. Heads: 4 of 16 dims (hidden 64), 2 KV heads; experts 4, 2 per token.
SMALL = dict(
    vocab_size=VOCAB, hidden_size=64, n_embd=64, d_model=64, dim=64, embed_dim=64, emb_dim=64, embedding_dim=64,
    embedding_size=64, word_embed_proj_dim=64, input_embedding_size=64, output_embedding_size=64,
    intermediate_size=64, n_inner=64, ffn_dim=64, dim_ff=64, decoder_ffn_dim=64, encoder_ffn_dim=64, ffn_hidden_size=64,
    feed_forward_size=64, dense_intermediate_size=64, intermediate_size_mlp=64, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, shared_intermediate_size=32, shared_experts_intermediate_size=32,
    moe_shared_expert_intermediate_size=32, expert_ffn_hidden_size=32, prefix_dense_intermediate_size=64,
    num_hidden_layers=2, n_layer=2, n_layers=2, num_layers=2, decoder_layers=2, encoder_layers=2, num_decoder_layers=2,
    num_encoder_layers=2,
    num_attention_heads=4, n_head=4, n_heads=4, num_heads=4, decoder_attention_heads=4, encoder_attention_heads=4,
    num_decoder_attention_heads=4, num_encoder_attention_heads=4, attention_heads=4,
    num_key_value_heads=2, num_kv_heads=2, head_dim=16, d_head=16, attention_head_dim=16, attention_head_size=16,
    dim_head=16, swa_head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2,
    kv_lora_rank=16, q_lora_rank=32, o_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    qk_head_dim=16, index_head_dim=16, index_n_heads=2, indexer_head_dim=16, indexer_n_heads=2, indexer_kv_heads=1,
    max_position_embeddings=512, n_positions=512, n_ctx=512, max_target_positions=512, max_source_positions=512,
    sliding_window=WINDOW, sliding_window_size=WINDOW, attention_window_size=WINDOW, window_size=WINDOW,
    local_attention_window_len=WINDOW, attention_chunk_size=WINDOW,
    num_experts=4, num_local_experts=4, n_routed_experts=4, moe_num_experts=4, num_experts_per_tok=2, top_k_experts=2,
    n_shared_experts=1, num_shared_experts=1, moe_num_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
    state_size=8, ssm_state_size=8, mamba_d_state=8, conv_kernel=4, time_step_rank=8, mamba_dt_rank=8, expand=2,
    mamba_expand=2, n_groups=1, mamba_n_groups=1, mamba_ngroups=1, mamba_n_heads=8, mamba_num_heads=8, n_mamba_heads=8,
    mamba_d_head=16, mamba_head_dim=16, mamba_chunk_size=16, chunk_size=16,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_num_heads=4, linear_head_dim=16, linear_conv_kernel_dim=4,
    num_nextn_predict_layers=0, num_mtp_layers=0,
)
DERIVED_BY_SOME = {"head_dim", "num_key_value_heads", "num_experts_per_tok"}
# Sizes a family needs beyond SMALL (as its transformers model tester sets them).
FAMILY_SIZES = {
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]]),
    "codegen": dict(rotary_dim=8),
    "gptj": dict(rotary_dim=8),
    "jamba": dict(attn_layer_offset=1, attn_layer_period=2, expert_layer_offset=1, expert_layer_period=2),
    "bamba": dict(attn_layer_indices=[1]),
    "granitemoehybrid": dict(layer_types=["mamba", "attention"]),
    "reformer": dict(axial_pos_embds_dim=[32, 32], axial_pos_shape=[16, 32], attn_layers=["local", "lsh"], num_hashes=1,
                     local_attn_chunk_length=8, lsh_attn_chunk_length=8),
}
# Special ids inside the small vocabulary; EOS is set off per generate call (fixed length).
SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
LAYER_LISTS = ("layer_types", "mlp_layer_types", "layers_block_type", "block_types", "attn_type", "attention_types")


def tiny_config(model_type: str):
    """The family's config class with small sizes (every field of SMALL it declares)."""
    return _small(CONFIG_MAPPING[model_type])


def _small(cls, depth: int = 0):
    names = {field.name for field in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    default = cls()
    # A size left None by default is derived by the config (or, for windows and chunks, off), except these,
    # which some modeling files read without deriving them.
    kwargs = {k: v for k, v in SMALL.items() if k in names and (getattr(default, k, None) is not None or k in DERIVED_BY_SOME)}
    if "kv_lora_rank" in names and "num_key_value_heads" in kwargs:  # latent attention (MLA): one KV head per head
        kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
    kwargs.update({k: v for k, v in FAMILY_SIZES.get(getattr(cls, "model_type", None), {}).items() if k in names})
    kwargs["initializer_range"] = 0.3 if "initializer_range" in names else None
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    for name in SPECIAL:
        value = getattr(default, name, None) if name in names else None
        if isinstance(value, int) and not 0 <= value < VOCAB:
            kwargs[name] = SPECIAL[name]
        elif isinstance(value, list):
            kwargs[name] = SPECIAL[name]
    if "is_decoder" in names or hasattr(default, "is_decoder"):
        kwargs["is_decoder"] = True
    # Per-layer lists: the family's distinct kinds, in order (the first two layers of a
    # 1-in-6 pattern would hide the rare kind), at least two layers.
    layers = None
    for name in LAYER_LISTS:
        value = getattr(default, name, None) if name in names else None
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            kinds = list(dict.fromkeys(value))
            layers = max(layers or 2, len(kinds))
    if layers is not None:
        for name in LAYER_LISTS:
            value = getattr(default, name, None) if name in names else None
            if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                kinds = list(dict.fromkeys(value))
                kwargs[name] = (kinds * layers)[:layers]
        for name in ("num_hidden_layers", "n_layer", "n_layers", "num_layers"):
            if name in kwargs:
                kwargs[name] = layers
    for name, sub in (getattr(cls, "sub_configs", None) or {}).items():
        if depth < 2 and isinstance(sub, type) and name in names:
            try:
                kwargs[name] = _small(sub, depth + 1)
            except Exception:  # noqa: BLE001 - a sub-config that cannot shrink keeps its default
                pass
    return cls(**kwargs)


def tiny_model(model_type: str):
    """A random-weight model of the family, seeded by its name; EOS off, embeddings scaled."""
    torch.manual_seed(zlib.crc32(model_type.encode()))
    config = tiny_config(model_type)
    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    with torch.device("meta"):  # sized before any memory is taken: a sub-config left at its default can be huge
        parameters = sum(p.numel() for p in model_class(config).parameters())
    if parameters > MAX_PARAMETERS:
        raise ValueError(f"{parameters / 1e6:.0f}M parameters at small sizes (a part tiny_config does not shrink)")
    model = model_class(config).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(EMBEDDING_SCALE)
    if hasattr(model, "set_default_language"):  # X-MOD: one adapter per language
        model.set_default_language(config.languages[0])
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def prompt(model_type: str) -> torch.Tensor:
    """(1, 24) ids: 6 tokens four times, away from the special ids."""
    generator = torch.Generator().manual_seed(zlib.crc32(model_type.encode()))
    return torch.randint(3, VOCAB, (6,), generator=generator).repeat(4)[None]


def outcome(run, expected) -> str:
    """exact / refused: reason / DIFFERENT / CRASHED: error."""
    try:
        got = run()
    except UnsupportedGenerationError as error:
        return f"refused: {error}"
    except ValueError as error:
        if TRANSFORMERS_REFUSAL in str(error):  # raised by transformers before any forward pass, before it reads the drafter
            return f"refused by transformers: {_line(error)}"
        return f"CRASHED: {type(error).__name__}: {_line(error)}"
    except Exception as error:  # noqa: BLE001 - a crash is the finding
        return f"CRASHED: {type(error).__name__}: {_line(error)}"
    return "exact" if got.tolist() == expected.tolist() else "DIFFERENT"


def run_family(model_type: str) -> dict:
    """{"family", "skipped": reason or None, path: outcome for each of PATHS}."""
    row = {"family": model_type, "skipped": None}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = tiny_model(model_type)
    except Exception as error:  # noqa: BLE001 - transformers' own fault: counted, not ours
        row["skipped"] = f"build: {type(error).__name__}: {_line(error)}"
        return row
    row["model"] = type(model).__name__
    ids = prompt(model_type)
    options = dict(max_new_tokens=NEW_TOKENS, do_sample=False)
    with torch.inference_mode():
        try:
            expected = model.generate(ids, **options)
        except Exception as error:  # noqa: BLE001
            row["skipped"] = f"plain greedy: {type(error).__name__}: {_line(error)}"
            return row
    paths = {
        "pld": lambda: model.generate(ids, prompt_lookup_num_tokens=8, **options),
        "assistant": lambda: model.generate(ids, assistant_model=LookupDrafter(), **options),
        "chain": lambda: lookahead.generate(model, ids, tree=False, **options),
        "tree": lambda: lookahead.generate(model, ids, tree=True, **options),
    }
    for path in PATHS:
        row[path] = outcome(paths[path], expected)
    return row


def sweep(model_types=None, *, progress=None) -> list[dict]:
    """run_family over `model_types` (default: every causal-LM family of the installed transformers)."""
    rows = []
    for model_type in model_types or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if progress is not None:
            print(model_type, file=progress, flush=True)
        rows.append(run_family(model_type))
    return rows


def summary(rows: list[dict]) -> dict:
    """Counts per path and kind, and each refusal reason with its families."""
    run = [r for r in rows if r["skipped"] is None]
    counts = {path: Counter(r[path].split(":")[0] for r in run) for path in PATHS}
    reasons = {}  # (path, outcome with the model's class name as <model>) -> families
    for r in run:
        for path in PATHS:
            if r[path].startswith(("refused", "CRASHED")):
                text = re.sub(r"\(relative error [^)]*\)", "(relative error ...)", r[path].replace(r["model"], "<model>"))
                reasons.setdefault((path, text), []).append(r["family"])
    return dict(families=len(rows), run=len(run), skipped=len(rows) - len(run), counts=counts, reasons=reasons)


def _line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0][:160] if text else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lookahead.bench.families", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object and nothing else on stdout")
    parser.add_argument("--only", default=None, help="comma-separated model types (default: every causal-LM family)")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    transformers.logging.set_verbosity_error()
    started = time.perf_counter()
    rows = sweep(args.only.split(",") if args.only else None, progress=sys.stderr)
    seconds = time.perf_counter() - started
    stats = summary(rows)
    if args.json:
        reasons = [dict(path=p, outcome=o, families=f) for (p, o), f in stats["reasons"].items()]
        print(json.dumps(dict(transformers=transformers.__version__, seconds=round(seconds, 1), rows=rows,
                              **{**stats, "reasons": reasons})))
        return 0
    print(format_table(["family", *PATHS], [[r["family"], *(_short(r[p]) for p in PATHS)] for r in rows if r["skipped"] is None]))
    print()
    print(f"transformers {transformers.__version__}: {stats['families']} families, {stats['run']} run, "
          f"{stats['skipped']} skipped (tiny model cannot be built or run plain greedy), {seconds:.0f} s")
    print(format_table(["path", *sorted({k for c in stats["counts"].values() for k in c})],
                       [[p, *(stats["counts"][p].get(k, 0) for k in sorted({k for c in stats["counts"].values() for k in c}))]
                        for p in PATHS]))
    print()
    for (path, text), families in sorted(stats["reasons"].items()):
        print(f"- {path}: {text} ({len(families)}: {', '.join(families)})")
    print()
    for r in rows:
        if r["skipped"] is not None:
            print(f"- skipped {r['family']}: {r['skipped']}")
    return 0


def _short(text: str) -> str:
    return text.split(":")[0]


if __name__ == "__main__":
    sys.exit(main())
