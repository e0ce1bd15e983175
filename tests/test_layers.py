"""The package's layers: a torch-free drafting core, frameworks only in integrations/, no import cycle."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lookahead"
FRAMEWORKS = {"torch", "transformers", "vllm"}
UPPER = ("integrations", "bench")  # the layers allowed to import a framework


def imports(path: Path, module_level_only: bool) -> set[str]:
    """Top-level names of the packages a module imports (lookahead's own as dotted module names)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            if node.module == "lookahead" or node.module.startswith("lookahead."):
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_no_core_module_imports_a_framework_even_lazily():
    for name, path in MODULES.items():
        if any(f".{layer}" in name for layer in UPPER) or name.endswith("__main__"):
            continue
        used = {n.split(".")[0] for n in imports(path, module_level_only=False)}
        assert not used & FRAMEWORKS, f"{name} imports {used & FRAMEWORKS}"


def test_module_level_imports_form_no_cycle():
    graph = {name: {n for n in imports(path, module_level_only=True) if n in MODULES and n != name} for name, path in MODULES.items()}
    state = {}

    def visit(name, stack):
        if state.get(name) == "done":
            return
        assert state.get(name) != "open", f"import cycle: {' -> '.join(stack + [name])}"
        state[name] = "open"
        for dep in graph[name]:
            if not name.startswith(dep + "."):  # a submodule reaching a sibling through its parent package
                visit(dep, stack + [name])
        state[name] = "done"

    for name in graph:
        visit(name, [])


def test_lower_layers_never_import_the_bench_at_module_level():
    for name, path in MODULES.items():
        if ".bench" in name or name.endswith("__main__"):
            continue
        assert not any(".bench" in n for n in imports(path, module_level_only=True)), name


def test_the_core_drafts_with_torch_and_transformers_blocked():
    code = """
import sys
for name in ("torch", "transformers", "vllm"):
    sys.modules[name] = None  # any import of them now raises ImportError
import lookahead
store = lookahead.TokenStore()
drafter = lookahead.LookupDrafter(memory=store, num_draft_tokens=3)
drafter.add_document([7, 8, 9, 10])
drafter.reset([1, 2, 3, 1, 2])
assert drafter.propose().token_ids.tolist() == [3, 1, 2], drafter.propose()
drafter.extend([3, 7, 8])
assert drafter.propose().token_ids.tolist() == [9, 10]
assert len(drafter.propose_tree(max_tree_nodes=4)) >= 1
from lookahead.sizing import DraftSizer, cost_curve, plan_step
sizer = DraftSizer(cost_curve([1, 1, 1, 1, 1.2, 1.7, 2.7]), drafter.max_ngram)
chain, draft, size = plan_step(drafter, sizer, 8)
assert 0 <= size <= len(chain)
try:
    lookahead.generate
except ImportError:
    pass
else:
    raise AssertionError("lookahead.generate needs torch")
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
