"""The errors lookahead raises on purpose; each subclasses ValueError, so `except ValueError` catches them."""


class StoreFileError(ValueError):
    """A saved store that cannot be loaded: corrupt, truncated, foreign or of another version."""


class UnsupportedGenerationError(ValueError):
    """The requested generate() options cannot be verified by the loop they were passed to."""
