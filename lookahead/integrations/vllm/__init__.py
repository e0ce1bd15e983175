"""Our drafter inside vLLM's speculative decoding (vLLM 0.32-0.33, V1 engine): `LookupProposer`.

    from vllm import LLM
    llm = LLM(model=..., speculative_config={"method": "custom_class",
              "model": "lookahead.integrations.vllm.LookupProposer", "num_speculative_tokens": 8},
              additional_config={"lookahead": {}})  # options: OPTIONS; {} for the defaults

One file per idea: `options` (our options, `engine_args`), `rows` (the runner found on the
stack: which request each row holds), `proposer` (the proposer vLLM builds and calls).
vLLM is not imported here: it builds the proposer and hands it plain arrays.
"""

from lookahead.integrations.vllm.options import LOGGER, OPTIONS, PROPOSER, engine_args, read_options, require_vllm
from lookahead.integrations.vllm.proposer import LookupProposer
from lookahead.integrations.vllm.stats import ProposerStats
from lookahead.integrations.vllm.rows import find_runner

__all__ = ["LOGGER", "OPTIONS", "PROPOSER", "LookupProposer", "ProposerStats", "engine_args", "find_runner", "read_options",
           "require_vllm"]
