"""The errors lookahead raises on purpose.

Bad input (a file, an option) raises a ValueError subclass, so `except ValueError` catches
it; a drafter asked to serve two requests at once raises DrafterInUseError, a RuntimeError
(nothing is wrong with the values: the call came at the wrong time).
"""


class StoreFileError(ValueError):
    """A saved store that cannot be loaded: corrupt, truncated, foreign or of another version."""


class UnsupportedGenerationError(ValueError):
    """The requested generate() options cannot be verified by the loop they were passed to."""


class DrafterInUseError(RuntimeError):
    """A LookupDrafter is serving a request in another thread; use one drafter per thread."""
