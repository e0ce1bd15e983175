"""lookahead: training-free drafting that makes language models generate faster, output unchanged."""

from lookahead.drafter import Draft, DraftStats, LookupDrafter
from lookahead.index import TokenIndex
from lookahead.integrations.transformers import UnsupportedGenerationError

__version__ = "0.1.0"

__all__ = ["Draft", "DraftStats", "LookupDrafter", "TokenIndex", "UnsupportedGenerationError", "__version__"]
