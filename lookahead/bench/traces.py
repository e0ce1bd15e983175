"""The forced model and its requests, below every bench mode.

- `Task`: one request (prompt, the output the model is forced to write, its EOS);
- `read_traces`, `forced_trace_task`: trace files (replay.load_trace) as tasks;
- `build_model`, `describe`, `parse_dtypes`: the random-weight model of a given shape;
- `force_reference`: forcing in the forward. The model's logits at each position are lifted
  so the reference's next token is the argmax there; nothing is made impossible and no
  logits processor is passed, so every method's loop (transformers' prompt lookup filters
  its candidates through the processors) runs as it does for a user; `forced_options`: a
  method's generate() options for a call under it.
"""

import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from lookahead.bench.replay import load_trace
import lookahead

SHARED_TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"  # ../shared/traces beside the checkout
# A 0.5B-class decoder (Qwen2-0.5B's shape), vocab set by the tokenizer.
DEFAULT_SHAPE = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2)
# --quick: a small shape (35M parameters at the built-in workloads' 8,192-token vocabulary), so prefilling a
# 1,200-token file takes a second, not twelve.
QUICK_SHAPE = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2)
# An 8B-class decoder (Llama-3.1-8B's shape, which wrote ../shared/traces); for a GPU.
SHAPE_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8)
# Tests and the GPU script's dry run: a forward of microseconds.
TINY_SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
SHAPE_NAMES = ("0.5b", "quick", "8b", "tiny")  # --shape: DEFAULT_SHAPE, QUICK_SHAPE, SHAPE_8B, TINY_SHAPE


@dataclass(frozen=True)
class Task:
    """One request: the prompt and, for the forced model, the output it is made to write."""

    prompt: list[int]
    reference: list[int] | None  # None: a real model writes what it writes
    eos_token_id: int | None  # None: the model's own
    max_new_tokens: int  # len(reference) when forced


def read_traces(paths: list[Path], requests: int | None, vocab: int | None) -> dict:
    """The first `requests` requests (all with None) of each file, by file name (the path
    where names repeat); every id checked below `vocab` unless it is None."""
    names = [p.name for p in paths]
    out = {}
    for path in paths:
        name = path.name if names.count(path.name) == 1 else str(path)
        loaded = load_trace(path)
        if vocab is not None:
            for i, r in enumerate(loaded, 1):
                top = max(int(r.prompt.max(initial=0)), int(r.output.max(initial=0)))
                if top >= vocab:
                    raise ValueError(f"{path}: request {i} holds token id {top}, not below --vocab-size {vocab}")
        out[name] = loaded[:requests]
    return out


def forced_trace_task(request, max_new_tokens: int) -> Task:
    """The recorded output cut to max_new_tokens; EOS is the recorded output's last token (the
    model's end-of-turn where it finished), so the forced model stops there as the real one
    did, or at the cut, never earlier."""
    output = request.output.tolist()
    eos = output[-1] if output else None
    reference = output[:max_new_tokens]
    if eos in reference:
        reference = reference[: reference.index(eos) + 1]
    return Task(request.prompt.tolist(), reference, eos, len(reference))


def trace_paths(args, mode: str) -> list[Path]:
    """--traces, else ../shared/traces/*.jsonl; none (shared/ absent): [] and one line on stderr saying `mode` is skipped."""
    paths = args.traces or sorted(SHARED_TRACES.glob("*.jsonl"))
    if not paths:
        print(f"lookahead bench {mode}: skipped: no trace files ({SHARED_TRACES} is absent; pass --traces FILE...)", file=sys.stderr)
    return paths


def parse_sizes(spec: str, *, option: str, least: int, example: str) -> list[int]:
    """A comma list of integers >= `least` given to `option` (--batch 1,4,16; --context 8192,16384)."""
    try:
        sizes = [int(s) for s in spec.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < least:
        raise ValueError(f"{option} takes a comma list of integers >= {least}, e.g. {example}, got {spec!r}")
    return sizes


def parse_dtypes(spec: str | None, *, device: str, traces: bool) -> list[torch.dtype]:
    """--dtype: float32, bfloat16, auto, or a comma list of them; duplicates dropped, order kept."""
    if spec is None:
        spec = "float32,bfloat16" if traces else "auto"
    dtypes = []
    for name in (s.strip() for s in spec.split(",")):
        if name == "auto":
            # Measured on this project's CPU (AVX-512 without bf16 units): fp32 verifies 16
            # tokens for 2.5x one token's cost, bf16 for 4.4x. GPUs are the other way round.
            name = "bfloat16" if device == "cuda" else "float32"
        if name not in ("float32", "bfloat16"):
            raise ValueError(f"--dtype takes float32, bfloat16, auto or a comma list of them, got {spec!r}")
        if getattr(torch, name) not in dtypes:
            dtypes.append(getattr(torch, name))
    return dtypes


def load_model(auto_class, name: str, **kwargs):
    """auto_class.from_pretrained(name); a model that cannot be loaded is one line, not transformers' traceback."""
    try:
        return auto_class.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as e:  # not found, not a model, offline
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"--model {name}: cannot load it ({reason})") from None


def shape_for(args, default: str = "0.5b") -> dict:
    """The forced model's shape: --shape's, else QUICK_SHAPE with --quick, else `default`'s (read at call time)."""
    name = getattr(args, "shape", None) or ("quick" if args.quick else default)
    if name not in SHAPE_NAMES:
        raise ValueError(f"--shape takes one of {', '.join(SHAPE_NAMES)}, got {name!r}")
    return {"0.5b": DEFAULT_SHAPE, "quick": QUICK_SHAPE, "8b": SHAPE_8B, "tiny": TINY_SHAPE}[name]


def build_model(*, shape: dict, vocab: int, dtype: torch.dtype, device: str):
    """Random weights (seed 0) of a Qwen2 decoder of `shape` at `vocab`, tied embeddings, in eval mode."""
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=vocab, tie_word_embeddings=True, **shape)
    with torch.device(device):  # initialised where it runs: an 8B shape's random init on a CPU takes minutes
        return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def describe(model, name: str | None = None) -> str:
    """`name` (a real model), or the random model's class, size and vocabulary."""
    if name:
        return name
    params = sum(p.numel() for p in model.parameters())
    return f"random {type(model).__name__} ({params / 1e6:.0f}M parameters, vocab {model.config.vocab_size}), forced to the references"


@contextmanager
def force_reference(model, prompt_len: int, reference: list[int]):
    """Within the block, a batch-of-one forward at absolute position p (its position_ids, or
    the cache's length + offset) makes reference[p + 1 - prompt_len] the argmax of its logits.

    Positions follow tree depth where the caller passes position_ids, so every node on the
    accepted path (whose tokens equal the reference up to it) is forced right; nodes off it
    are never accepted, whatever they predict. The lift is top + |top|/32 + 1, strictly above
    every other logit in bfloat16 too (8 bits of mantissa). No host sync: a few tensor ops per forward.

    A forced model's predictions are not a model's: off the accepted path its top-1 is the
    reference's token for that position, whatever the node's ancestors. So within the block the
    prediction table learns from the kept path alone (pass the call's options through
    `forced_options`); beyond the forced token its top-k is the random model's noise, which can
    only cost the blend.
    """
    target = torch.tensor(reference, dtype=torch.long, device=model.device)  # (n,)
    n = target.shape[0]
    positions = []  # [the positions of the forward in flight, (1, L)]

    def before(module, args, kwargs):
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        if ids.shape[0] != 1:
            raise ValueError(f"force_reference forces a batch of one; the forward got {ids.shape[0]} rows")
        given = kwargs.get("position_ids")
        if given is None:
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            past = cache.get_seq_length() if cache is not None else 0
            given = torch.arange(past, past + ids.shape[1], device=ids.device)[None]
        positions[:] = [given]

    def after(module, args, kwargs, output):
        logits = output.logits[0]  # (K, vocab): the last K positions of the input
        t = positions[0][0, -logits.shape[0] :] + 1 - prompt_len  # (K,) index in reference of the token each row predicts
        valid = (t >= 0) & (t < n)
        rows = torch.arange(logits.shape[0], device=logits.device)
        tokens = target[t.clamp(0, n - 1)]
        top = logits.max(-1).values
        logits[rows, tokens] = torch.where(valid, top + top.abs() / 32 + 1, logits[rows, tokens])
        return output

    with forward_hooks(model, before, after):
        yield


@contextmanager
def forward_hooks(model, before, after):
    """Within the block, before(module, args, kwargs) runs ahead of every forward of `model` and
    after(module, args, kwargs, output) behind it (its return value replaces the output)."""
    handles = [model.register_forward_pre_hook(before, with_kwargs=True), model.register_forward_hook(after, with_kwargs=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def forced_options(options: dict) -> dict:
    """A method's model.generate() options for a call under force_reference: through our loop
    (custom_generate=lookahead.generate) the prediction table learns from the kept path alone
    (record_rejected=False, see force_reference); any other method's as given."""
    return options | dict(record_rejected=False) if options.get("custom_generate") is lookahead.generate else options
