"""The examples run as a user runs them (a subprocess from the repository root, small arguments),
stay short, and name only paths that exist.

examples/vllm_serving.py needs vLLM: skipped where it is not installed; `.ci/vllm` runs this file in
its vLLM venv with LOOKAHEAD_REQUIRE_VLLM=1, where a vLLM that fails to import fails it instead.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
# Per example: its small arguments, and what its output must show (each example asserts its own exactness).
RUNS = {
    "quickstart.py": (["--max-new-tokens", "24"], "tokens per forward pass"),
    "rag_documents.py": ([], "tokens per forward pass"),
    "vllm_serving.py": (["--max-tokens", "24"], "lookahead drafted"),
}
MAX_LINES = {"vllm_serving.py": 80}  # start vLLM with the proposer, generate, print what was drafted and kept
DEFAULT_MAX_LINES = 120
NEEDS_VLLM = {"vllm_serving.py"}
# A repository path in an example's text: a top-level folder of this repository, then a file or folder name.
REPO_PATH = re.compile(r"(?<![\w./-])((?:lookahead|examples|benchmarks|docs|tests|notes)/[\w./-]*\w)")
# Files whose install lines must name the checkout form while the package is not published (README.md: its own test).
INSTALL_SCANNED = ["examples", "benchmarks", "docs", "lookahead"]


def test_every_example_has_a_run_and_is_short():
    assert {p.name for p in EXAMPLES} == set(RUNS), "an example without a run in RUNS, or a run without its example"
    for path in EXAMPLES:
        lines = len(path.read_text().splitlines())
        assert lines <= MAX_LINES.get(path.name, DEFAULT_MAX_LINES), f"{path.name}: {lines} lines"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_names_only_paths_that_exist(path):
    missing = [name for name in REPO_PATH.findall(path.read_text()) if not (ROOT / name).exists()]
    assert not missing, f"{path.name} names {missing}, which do not exist"


def test_install_lines_name_the_checkout_form():
    """`lookahead-drafts` is not on PyPI yet: `pip install "lookahead-drafts[...]"` fails on a fresh machine."""
    found = [f"{p.relative_to(ROOT)}:{n}" for folder in INSTALL_SCANNED for p in sorted((ROOT / folder).rglob("*"))
             if p.suffix in (".py", ".md", ".sh", ".txt") for n, line in enumerate(p.read_text().splitlines(), 1)
             if "lookahead-drafts[" in line]
    assert not found, f"install lines naming the unpublished distribution: {found}"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path):
    if path.name in NEEDS_VLLM:
        if os.environ.get("LOOKAHEAD_REQUIRE_VLLM") != "1":
            pytest.importorskip("vllm")
    args, shown = RUNS[path.name]
    # This checkout's package, for the example and for vLLM's worker processes (which import lookahead).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    run = subprocess.run([sys.executable, str(path.relative_to(ROOT)), *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, f"{path.name} failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    assert shown in run.stdout, run.stdout[-2000:]
