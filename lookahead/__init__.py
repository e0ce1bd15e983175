"""lookahead: training-free drafting that makes language models generate faster, output unchanged.

The drafting core (index, drafter, stores, sizing) needs numpy and numba only;
`generate`, `verify_costs` and `CUSTOM_GENERATE` (the folder transformers' custom_generate
loads our loop from, lookahead.integrations.hub) need torch and transformers and are
imported on first use.
"""

from lookahead.documents import DocumentLibrary
from lookahead.draft import Draft, DraftStats
from lookahead.drafter import LookupDrafter
from lookahead.errors import DrafterInUseError, StoreFileError, UnsupportedGenerationError
from lookahead.index import TokenIndex
from lookahead.predictions import PredictionTable
from lookahead.store import TokenStore

__version__ = "0.2.0"

__all__ = [
    "CUSTOM_GENERATE",
    "DocumentLibrary",
    "Draft",
    "DraftStats",
    "DrafterInUseError",
    "LookupDrafter",
    "PredictionTable",
    "StoreFileError",
    "TokenIndex",
    "TokenStore",
    "UnsupportedGenerationError",
    "generate",
    "verify_costs",
    "__version__",
]


def __getattr__(name: str):
    # PEP 562: the torch-side names load on first use, so `import lookahead` stays torch-free.
    if name == "generate":
        from lookahead.integrations.generate import generate

        return generate
    if name == "CUSTOM_GENERATE":
        from lookahead.integrations.hub import FOLDER

        return FOLDER
    if name == "verify_costs":
        from lookahead.integrations.calibration import verify_costs

        return verify_costs
    raise AttributeError(f"module 'lookahead' has no attribute {name!r}")
