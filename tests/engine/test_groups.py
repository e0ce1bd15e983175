"""The kernels' tuple groups (engine.groups', trie.py's trie, index/kernels.py's index): each builder puts every field
where the kernels read it, `group[GROUP_FIELD]`."""

import inspect

import pytest

from lookahead import trie
from lookahead.engine import groups
from lookahead.index import IndexBuffers, kernels

def _python(builder):  # an njit builder (the groups kernels build themselves) through its Python function
    return getattr(builder, "py_func", builder)


BUILDERS = [(groups, _python(getattr(groups, name))) for name in dir(groups) if name.endswith("_group")] + [
    (trie, trie.trie_group), (kernels, kernels.index_group.py_func)]


def test_every_engine_group_has_a_builder():
    prefixes = {name.split("_")[0] for name in dir(groups) if name.isupper()}
    assert prefixes == {builder.__name__.removesuffix("_group").upper() for module, builder in BUILDERS if module is groups}


@pytest.mark.parametrize("module, builder", BUILDERS, ids=lambda value: getattr(value, "__name__", ""))
def test_each_field_is_read_by_its_constant(module, builder):
    prefix = builder.__name__.removesuffix("_group").upper() + "_"
    fields = list(inspect.signature(builder).parameters)
    group = builder(**{field: f"sentinel {field}" for field in fields})  # each field a value of its own
    constants = {name: getattr(module, name) for name in dir(module) if name.startswith(prefix)}
    assert sorted(constants) == sorted(prefix + field.upper() for field in fields)  # a constant per field, no other
    assert sorted(constants.values()) == list(range(len(fields))) == list(range(len(group)))
    for field in fields:
        assert group[constants[prefix + field.upper()]] == f"sentinel {field}"


def test_index_buffers_hold_the_index_tuples_fields_in_order():  # kernels take tuple(TokenIndex.buffers())
    fields = {field: f"sentinel {field}" for field in inspect.signature(kernels.index_group.py_func).parameters}
    assert tuple(IndexBuffers(**fields)) == kernels.index_group.py_func(**fields)
