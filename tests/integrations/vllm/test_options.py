"""The proposer's options (lookahead.integrations.vllm.options): every default works, bad ones are refused by name,
memory and documents load from files, and engine_args checks them before an engine starts.
"""

import sys
from types import SimpleNamespace

import pytest

from lookahead.integrations.vllm import PROPOSER, LookupProposer, engine_args, read_options
from tests.fake_runner import FakeRunner, fake_config, new_proposer


def test_every_option_has_a_working_default():
    options = read_options(None)
    assert options == read_options({})
    proposer = LookupProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                                              model_config=SimpleNamespace(max_model_len=64), additional_config={}))
    FakeRunner(proposer)
    assert proposer.options == options and proposer.memory is not None and proposer.eos_token_id is None


@pytest.mark.parametrize("options, message", [
    ({"min_gram": 2}, r"unknown lookahead option\(s\) \['min_gram'\]"),
    ({"min_ngram": 0}, "min_ngram must be an int >= 1, got 0"),
    ({"min_ngram": 4, "max_ngram": 2}, r"max_ngram \(2\) must be >= min_ngram \(4\)"),
    ({"draft_factor": "big"}, "draft_factor must be a number > 0, got 'big'"),
    ({"memory": 1}, "memory must be a bool"),
    ({"memory_tokens": 8}, "memory_tokens must be an int >= 16"),
    ({"fixed_cost_tokens": 0}, r"fixed_cost_tokens must be None \(measured\) or a number in \[1, 4096\]"),
    ({"row_identity": "row"}, "row_identity must be 'auto'"),
])
def test_bad_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        LookupProposer(fake_config(**options))


def test_options_must_be_a_dict():
    config = fake_config()
    config.additional_config = {"lookahead": [("min_ngram", 2)]}
    with pytest.raises(TypeError, match=r'additional_config\["lookahead"\] must be a dict'):
        LookupProposer(config)


def test_memory_and_documents_load_from_files(tmp_path):
    from lookahead import DocumentLibrary, TokenStore

    store = TokenStore()
    store.add([9, 10, 11, 12])
    store.save(tmp_path / "memory.npz")
    library = DocumentLibrary()
    library.add([60, 61, 62, 63])
    library.save(tmp_path / "documents.npz")
    proposer = new_proposer(memory_path=str(tmp_path / "memory.npz"), documents_path=str(tmp_path / "documents.npz"))
    runner = FakeRunner(proposer)
    assert runner.step(proposer, [("a", [1, 10], [11]), ("b", [5, 61], [62])], [[11], [62]]) == [[12], [63]]


def test_engine_args_without_vllm_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(ImportError, match=r'pip install "\.\[vllm\]"'):
        engine_args()


def test_engine_args_checks_options_before_an_engine_starts(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace())
    assert engine_args(num_draft_tokens=6, memory=False) == {
        "speculative_config": {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 6},
        "additional_config": {"lookahead": {"memory": False}},
    }
    with pytest.raises(ValueError, match="unknown lookahead option"):
        engine_args(max_ngrams=4)
    with pytest.raises(ValueError, match="num_draft_tokens must be an int >= 1"):
        engine_args(num_draft_tokens=0)


def fake_vllm(monkeypatch, *fields):
    """A stand-in vllm package whose vllm.config.SpeculativeConfig has `fields`."""
    import dataclasses

    config = SimpleNamespace(SpeculativeConfig=dataclasses.make_dataclass("SpeculativeConfig", [(f, object, None) for f in fields]))
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(config=config))
    monkeypatch.setitem(sys.modules, "vllm.config", config)


def test_engine_args_names_the_proposer_by_the_installed_vllms_key(monkeypatch):
    fake_vllm(monkeypatch, "model", "method", "num_speculative_tokens")  # 0.32, 0.33
    assert engine_args()["speculative_config"]["model"] == PROPOSER
    fake_vllm(monkeypatch, "model", "method", "num_speculative_tokens", "custom_proposer_backend")  # vLLM's main branch
    spec = engine_args()["speculative_config"]
    assert spec["custom_proposer_backend"] == PROPOSER and "model" not in spec
