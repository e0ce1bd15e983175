"""lookahead's decoding method for transformers' `custom_generate`: exact speculative decoding with
training-free lookup drafts (the `lookahead-drafts` package; until it is published, `pip install .`
from its checkout). Pass the drafter as `assistant=`:

    model.generate(**inputs, custom_generate=FOLDER, trust_remote_code=True, assistant=LookupDrafter())
"""

from lookahead.integrations.hub import generate  # noqa: F401  (transformers calls generate(model, ...))
