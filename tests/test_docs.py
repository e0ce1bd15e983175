"""The documentation's code runs: every ```python block of README.md and docs/*.md, and its
`lookahead replay` commands.

A python block runs in a fresh namespace from the repository root. A block whose first line
is `# needs: ...` says what else it needs (docs/testing.md):
- `shared`: ../shared beside the project (stories260K, the traces): run when present;
- `download` (a hub model), `vllm`: never run here; the README's quickstart (a hub model) runs
  with the offline stories260K in its place.
Every relative link and #anchor of those pages resolves.
"""

import glob
import importlib.util
import re
import shlex
import subprocess
import sys
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
# The README's first example loads QUICKSTART_MODEL from the hub; the tests (and .ci/wheel) run it
# with OFFLINE_MODEL, from the repository root.
QUICKSTART_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
OFFLINE_MODEL = "../shared/models/stories260K"


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
    if "suffix" in argv and importlib.util.find_spec("arctic_inference") is None:
        pytest.skip(f"{where}: --drafter suffix needs arctic-inference, not installed here (.ci/vllm runs it)")
    monkeypatch.chdir(ROOT)
    expanded = []
    for word in argv:
        matches = sorted(glob.glob(word)) if "*" in word else [word]
        assert matches, f"{where}: {word} matches no file"
        expanded += matches
    assert lookahead_cli(expanded + ["--limit", "2"]) == 0
    assert "tau" in capsys.readouterr().out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (a link's label, no markup), lowercase, spaces to '-',
    punctuation other than '-' and '_' dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The #fragments a page offers: its headings as GitHub slugs them (a repeated one gets -1, -2, ...),
    and explicit ids."""
    text = FENCE.sub("", page.read_text())
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+?)[ \t#]*$", text, re.M):
        base = slug(heading)
        found.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
    return found | set(re.findall(r'<a (?:id|name)="([^"]+)"', text))


def relative_links(page: Path) -> list[tuple[str, str]]:
    """(target, fragment) of every relative markdown link on a page, outside code blocks and code spans."""
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text()))
    links = re.findall(r"\]\(\s*<?([^)\s>]*?)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    return [tuple(link.partition("#")[::2]) for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link)]


def test_slugs_follow_github():
    assert slug("The first call: `lookahead bench --cold`") == "the-first-call-lookahead-bench---cold"
    assert slug("What is refused, and why") == "what-is-refused-and-why"
    assert slug("Serving: [vLLM](vllm.md) and `custom_class`") == "serving-vllm-and-custom_class"
    assert slug("4. Sizing") == "4-sizing"


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_relative_links_point_at_files_and_headings(page):
    broken = []
    for target, fragment in relative_links(page):
        linked = (page.parent / target).resolve() if target else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and (linked.is_dir() or fragment not in anchors(linked)):
            broken.append(f"{target}#{fragment}: no such heading or id")
    assert not broken, f"{page.relative_to(ROOT)} links to " + "; ".join(broken)


def readme_quickstart(readme: str, model: str | None = None) -> str:
    """The README's first python block after '## Quickstart' (as .ci/wheel reads it), its hub model
    replaced by `model` (.ci/wheel runs it the same way)."""
    code = re.search(r"```python\n(.*?)```", readme[readme.index("## Quickstart") :], re.S).group(1)
    return code if model is None else code.replace(f'name = "{QUICKSTART_MODEL}"', f'name = "{model}"')


def test_the_readme_opens_with_the_quickstart_drop_in():
    readme = (ROOT / "README.md").read_text()
    first = next(code for where, _, code in PYTHON if where.startswith("README.md"))
    assert first == readme_quickstart(readme), "README's first python block is not its ## Quickstart block"
    assert "download" in NEEDS.match(first.split("\n", 1)[0]).group(1)
    assert first.count(f'name = "{QUICKSTART_MODEL}"') == 1, f"the quickstart no longer loads {QUICKSTART_MODEL} by `name`"
    assert "assistant_model=" in first and "custom_generate" not in first and "lookahead.generate" not in first


def test_readme_quickstart_runs_offline_on_stories260k(monkeypatch, capsys):
    """The README's first example, with the offline stories260K for its hub model: runs, prints the
    speed-up line and its explanation, and writes what plain generate writes."""
    model = SHARED / "models" / "stories260K"
    if not model.is_dir():
        pytest.skip(f"needs {model} (../shared is not laid out beside the project)")
    monkeypatch.chdir(ROOT)
    code = readme_quickstart((ROOT / "README.md").read_text(), OFFLINE_MODEL)
    assert OFFLINE_MODEL in code and QUICKSTART_MODEL not in code
    namespace = {"__name__": "__docs__"}
    exec(compile(code, "README.md:quickstart (offline)", "exec"), namespace)
    assert namespace["ours"].tolist() == namespace["plain"].tolist()
    assert namespace["ours"].shape[1] > namespace["inputs"]["input_ids"].shape[1]
    out = capsys.readouterr().out
    assert "tokens/s" in out and "x)" in out and "tokens per forward pass" in out, out


def test_examples_quickstart_says_what_its_model_is(monkeypatch):
    """examples/quickstart.py (offline): names its stand-in model and why, prints the speed-up with its
    explanation, and its output excerpt is code, not a markdown fence."""
    monkeypatch.chdir(ROOT)
    run = subprocess.run([sys.executable, "examples/quickstart.py", "--max-new-tokens", "24"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Stand-in model" in run.stdout and "no trained model can be downloaded offline" in run.stdout
    assert re.search(r"^speed-up [\d.]+x, [\d.]+ tokens per forward pass", run.stdout, re.M), run.stdout
    assert not re.search(r"^\s*```", run.stdout, re.M), run.stdout


@pytest.mark.parametrize("path,limit,unit", [("README.md", 12_288, "bytes"), ("docs/benchmarks.md", 400, "lines"),
                                             ("docs/vllm.md", 400, "lines"), ("examples/quickstart.py", 120, "lines")])
def test_pages_stay_within_their_limits(path, limit, unit):
    text = (ROOT / path).read_text()
    size = len(text.encode()) if unit == "bytes" else text.count("\n")
    assert size <= limit, f"{path}: {size} {unit}, over {limit}: move detail to docs/ or notes/"
