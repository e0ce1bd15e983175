"""lookahead as a transformers `custom_generate` decoding method (a folder with `custom_generate/generate.py`).

transformers loads decoding methods from a Hub repository or a local folder holding
`custom_generate/generate.py` (and `requirements.txt`, which it checks against what is
installed). Two ways to use ours, both running code from a folder, hence `trust_remote_code=True`:

    model.generate(**inputs, custom_generate=lookahead.integrations.hub.FOLDER, trust_remote_code=True,
                   assistant=LookupDrafter())

or, once `write_custom_generate(model_folder)` has put the folder beside a saved model, every
`AutoModelForCausalLM.from_pretrained(model_folder, trust_remote_code=True)` has our `generate`:
`model.generate(**inputs, assistant=LookupDrafter())` runs `lookahead.generate`, and a call
without `assistant=` (or `drafter=`) runs transformers' own generate, unchanged.
"""

import shutil
from pathlib import Path

from lookahead.integrations.generate import through_transformers

FOLDER = str(Path(__file__).resolve().parent)  # holds custom_generate/: pass it as custom_generate=, or upload it to a Hub repository
LOOP_OPTIONS = ("tree", "max_tree_nodes", "streamer", "tokenizer", "stop_strings", "record_rejected")  # lookahead.generate's own, besides the drafter


def generate(inputs=None, generation_config=None, logits_processor=None, stopping_criteria=None, *, model, assistant=None,
             drafter=None, **kwargs):
    """transformers' custom_generate entry: `lookahead.generate` with the drafter given as `assistant=`
    (or `drafter=`), every other argument as model.generate takes it (a tokenizer for stop strings
    included); without a drafter, transformers' own generate. transformers passes `model=` by
    keyword, and a model folder's override is `partial(generate, model=model)`, called as
    model.generate is (the inputs may come first, positionally), so `model` is keyword-only.

    Raises:
        TypeError: both assistant= and drafter=.
    """
    if assistant is not None and drafter is not None:
        raise TypeError("pass the drafter once: assistant= (or drafter=)")
    drafter = assistant if assistant is not None else drafter
    if drafter is None:  # not ours to run: transformers' generate, as it runs without this folder
        return type(model).generate(model, inputs, generation_config, logits_processor, stopping_criteria, **kwargs)
    loop = {name: kwargs.pop(name) for name in LOOP_OPTIONS if name in kwargs}
    input_ids = inputs if inputs is not None else kwargs.pop("input_ids", None)
    return through_transformers(model, input_ids, dict(drafter=drafter, **loop), generation_config=generation_config,
                                logits_processor=logits_processor, stopping_criteria=stopping_criteria, **kwargs)


def write_custom_generate(model_folder) -> Path:
    """Copies custom_generate/ (generate.py, requirements.txt, README.md) into `model_folder` (a saved
    model's folder, or a folder to upload as a Hub repository); returns the copy's path.

    Raises:
        NotADirectoryError: `model_folder` is not a folder.
    """
    target = Path(model_folder)
    if not target.is_dir():
        raise NotADirectoryError(f"model_folder must be an existing folder (a saved model's), got {str(model_folder)!r}")
    return Path(shutil.copytree(Path(FOLDER) / "custom_generate", target / "custom_generate", dirs_exist_ok=True))
