"""The documentation's code runs: every ```python block of README.md and docs/*.md, and its
`lookahead replay` commands.

A python block runs in a fresh namespace from the repository root. A block whose first line
is `# needs: ...` says what else it needs (docs/testing.md):
- `shared`: ../shared beside the project (stories260K, the traces): run when present;
- `download` (a hub model), `vllm`: never run here.
"""

import glob
import re
import shlex
from pathlib import Path

import pytest

from lookahead.bench.cli import main as lookahead_cli

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
NEEDS = re.compile(r"#\s*needs:\s*([\w, ]+)")
KNOWN_NEEDS = {"shared", "download", "vllm"}
NEVER_RUN = {"download", "vllm"}
# Blocks that need nothing: README's batch and documents examples, design.md's drafter
# lifecycle, testing.md's tiny-model example. A parser that finds fewer has broken.
MIN_OFFLINE_BLOCKS = 4


def blocks(language: str) -> list[tuple[str, frozenset, str]]:
    """(where, needs, code) of every fenced block in `language`, where = 'page:line'."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) != language:
                continue
            code = match.group(2)
            first = code.split("\n", 1)[0]
            needs = NEEDS.match(first.strip())
            tags = frozenset(t.strip() for t in needs.group(1).split(",")) if needs else frozenset()
            line = text.count("\n", 0, match.start()) + 2  # the block's first code line
            found.append((f"{page.relative_to(ROOT)}:{line}", tags, code))
    return found


PYTHON = blocks("python")
RUNNABLE = [(where, tags, code) for where, tags, code in PYTHON if not tags & NEVER_RUN]


def replay_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after `lookahead`) of every `lookahead replay` line in a bash block."""
    commands = []
    for where, _, code in blocks("bash"):
        for line in code.splitlines():
            if line.startswith("lookahead replay "):
                commands.append((where, shlex.split(line, comments=True)[1:]))
    return commands


def test_the_docs_hold_python_blocks_that_run_offline():
    offline = [where for where, tags, _ in PYTHON if not tags]
    assert len(offline) >= MIN_OFFLINE_BLOCKS, f"only {offline} need nothing: the fence parser or the docs changed"
    assert any(where.startswith("README.md") for where in offline), "README.md has no block that runs offline"
    for where, tags, _ in PYTHON:
        assert tags <= KNOWN_NEEDS, f"{where}: unknown needs {sorted(tags - KNOWN_NEEDS)}; known: {sorted(KNOWN_NEEDS)}"


@pytest.mark.parametrize("where,tags,code", RUNNABLE, ids=[where for where, _, _ in RUNNABLE])
def test_python_block_runs(where, tags, code, monkeypatch):
    if "shared" in tags and not SHARED.is_dir():
        pytest.skip(f"{where} needs {SHARED} (../shared is not laid out beside the project)")
    monkeypatch.chdir(ROOT)  # blocks read ../shared relative to the repository
    exec(compile(code, where, "exec"), {"__name__": "__docs__"})


def test_the_docs_show_lookahead_replay():
    assert any(where.startswith("README.md") for where, _ in replay_commands())


@pytest.mark.parametrize("where,argv", replay_commands(), ids=[" ".join(argv) for _, argv in replay_commands()])
def test_replay_command_runs_on_two_requests(where, argv, monkeypatch, capsys):
    if not (SHARED / "traces").is_dir():
        pytest.skip(f"{where} replays {SHARED / 'traces'} (../shared is not laid out beside the project)")
    monkeypatch.chdir(ROOT)
    expanded = []
    for word in argv:
        matches = sorted(glob.glob(word)) if "*" in word else [word]
        assert matches, f"{where}: {word} matches no file"
        expanded += matches
    assert lookahead_cli(expanded + ["--limit", "2"]) == 0
    assert "tau" in capsys.readouterr().out


def anchors(page: Path) -> set[str]:
    """The #fragments a page offers: its headings as GitHub slugs them, and explicit ids."""
    text = FENCE.sub("", page.read_text())
    slugs = {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in re.findall(r"^#+ (.+)$", text, re.M)}
    return slugs | set(re.findall(r'<a id="([^"]+)">', text))


def test_relative_links_point_at_files_and_headings():
    for page in PAGES:
        for target, fragment in re.findall(r"\]\(([^)#:]*)(?:#([^)]*))?\)", page.read_text()):
            linked = (page.parent / target) if target else page
            assert linked.is_file(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
            if fragment:
                assert fragment in anchors(linked), f"{page.relative_to(ROOT)} links to {target}#{fragment}: no such heading"
