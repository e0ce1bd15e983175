"""lookahead: training-free drafting that makes language models generate faster, output unchanged."""

from lookahead.documents import DocumentLibrary
from lookahead.drafter import Draft, DraftStats, LookupDrafter
from lookahead.engine import generate
from lookahead.index import TokenIndex
from lookahead.integrations.transformers import UnsupportedGenerationError
from lookahead.store import StoreFileError, TokenStore

__version__ = "0.1.0"

__all__ = [
    "DocumentLibrary",
    "Draft",
    "DraftStats",
    "LookupDrafter",
    "StoreFileError",
    "TokenIndex",
    "TokenStore",
    "UnsupportedGenerationError",
    "generate",
    "__version__",
]
