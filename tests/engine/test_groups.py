"""engine.groups: each builder puts every field where the kernels read it (`group[GROUP_FIELD]`)."""

import inspect

import pytest

from lookahead.engine import groups

BUILDERS = [getattr(groups, name) for name in dir(groups) if name.endswith("_group")]


def test_every_group_has_a_builder():
    prefixes = {name.split("_")[0] for name in dir(groups) if name.isupper()}
    assert prefixes == {builder.__name__.removesuffix("_group").upper() for builder in BUILDERS}


@pytest.mark.parametrize("builder", BUILDERS, ids=lambda builder: builder.__name__)
def test_each_field_is_read_by_its_constant(builder):
    prefix = builder.__name__.removesuffix("_group").upper() + "_"
    fields = list(inspect.signature(builder).parameters)
    group = builder(**{field: f"sentinel {field}" for field in fields})  # each field a value of its own
    constants = {name: getattr(groups, name) for name in dir(groups) if name.startswith(prefix)}
    assert sorted(constants) == sorted(prefix + field.upper() for field in fields)  # a constant per field, no other
    assert sorted(constants.values()) == list(range(len(fields))) == list(range(len(group)))
    for field in fields:
        assert group[constants[prefix + field.upper()]] == f"sentinel {field}"
