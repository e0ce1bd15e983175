"""benchmarks/loop_floor.py runs: greedy, our chains and our loop without drafts on the traces, every output exact."""

import importlib.util
from pathlib import Path

import pytest

from lookahead.request import Request
from tests.models import SHARED

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "loop_floor.py"


@pytest.mark.skipif(not (SHARED / "traces").is_dir(), reason="../shared/traces is absent")
def test_the_floor_runs_every_method_exact(capsys):
    spec = importlib.util.spec_from_file_location("loop_floor", SCRIPT)
    loop_floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loop_floor)
    loop_floor.main(["--requests", "1", "--max-new-tokens", "24", "--repeats", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and ".dev.jsonl" in line]
    assert len(rows) == 3 and all(row.rstrip(" |").endswith("yes") for row in rows)
    assert Request.plan.__name__ == "plan" and Request.verified.__name__ == "verified"  # the stubs are gone after the calls
