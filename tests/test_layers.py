"""The package's layers: a torch-free drafting core, frameworks only in integrations/, no import cycle at any depth,
no private name used across modules."""

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


# The upward imports the package allows, each on first use so that the core stays torch-free:
# the drafter's hook into the assistant_model= adapter, and lookahead's torch-side public names.
ALLOWED_UPWARD = {
    ("lookahead.drafter", "lookahead.integrations.assistant"),
    ("lookahead", "lookahead.integrations.generate"),
    ("lookahead", "lookahead.integrations.calibration"),
}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports at any depth (function-level too), less ALLOWED_UPWARD."""
    graph = {}
    for name, path in MODULES.items():
        deps = {n for n in imports(path, module_level_only=False) if n in MODULES and n != name}
        graph[name] = {d for d in deps if (name, d) not in ALLOWED_UPWARD and not name.startswith(d + ".")}
    return graph  # (a submodule reaching a sibling through its parent package is not an edge)


def test_no_two_modules_import_each_other_at_any_depth():
    graph = import_graph()
    state = {}

    def visit(name, stack):
        if state.get(name) == "done":
            return
        assert state.get(name) != "open", f"import cycle: {' -> '.join(stack + [name])}"
        state[name] = "open"
        for dep in sorted(graph[name]):
            visit(dep, stack + [name])
        state[name] = "done"

    for name in graph:
        visit(name, [])


def path_between(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """A chain of imports in `graph` from `start` to `goal`, both included; None if there is none."""
    came_from, frontier = {start: None}, [start]
    while frontier:
        name = frontier.pop()
        if name == goal:
            chain = []
            while name is not None:
                chain.append(name)
                name = came_from[name]
            return chain[::-1]
        for dep in sorted(graph[name]):
            if dep not in came_from:
                came_from[dep] = name
                frontier.append(dep)
    return None


def test_no_allowed_upward_import_closes_a_cycle():
    # The cycle test walks the graph without ALLOWED_UPWARD, so a cycle through one of them hides
    # there (the drafter's hook -> integrations.assistant -> request -> drafter did): what an allowed
    # import reaches must not reach back to its importer.
    graph = import_graph()
    for importer, imported in sorted(ALLOWED_UPWARD):
        back = path_between(graph, imported, importer)
        assert back is None, f"the allowed {importer} -> {imported} closes a cycle: {' -> '.join([importer] + back)}"


def test_the_request_imports_only_the_draft_the_engine_and_sizing():
    # Regression: request.py imported LookupDrafter for a default and a type annotation, closing the
    # cycle above; it drives any draft.DraftSource. (`from lookahead import ...` counts: the package is a module here.)
    used = {n for n in imports(MODULES["lookahead.request"], module_level_only=False) if n in MODULES}
    assert used <= {"lookahead.draft"} | {m for m in MODULES if m.startswith(("lookahead.sizing", "lookahead.engine"))}, used


def test_the_engine_imports_no_drafter_and_no_integration():
    # The engine is below the drafter and every loop: what it shares with LookupDrafter lives in lookahead.policy.
    for name in (m for m in MODULES if m.startswith("lookahead.engine")):
        used = {n for n in imports(MODULES[name], module_level_only=False) if n in MODULES}
        assert not {u for u in used if u.startswith(("lookahead.drafter", "lookahead.integrations", "lookahead.request"))}, (name, used)


def test_the_allowed_upward_imports_are_still_there():
    # Named here so that a new upward import fails the cycle test rather than hiding among these.
    for importer, imported in ALLOWED_UPWARD:
        assert imported in imports(MODULES[importer], module_level_only=False), (importer, imported)


TESTS = Path(__file__).resolve().parent


def private_names_across_modules(path: Path) -> list[str]:
    """`from lookahead.x import _name`, `module._name` on an imported lookahead module, and
    monkeypatch.setattr(module, "_name", ...) in the file at `path`."""
    tree = ast.parse(path.read_text())
    modules, found = set(), []  # local names bound to what the package defines
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lookahead"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                modules.add(alias.asname or alias.name)  # a module, class or function of the package
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("lookahead") and alias.asname:
                    modules.add(alias.asname)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setattr" and len(node.args) >= 2
                and isinstance(node.args[0], ast.Name) and node.args[0].id in modules and isinstance(node.args[1], ast.Constant)
                and str(node.args[1].value).startswith("_")):
            found.append(f"line {node.lineno}: setattr({node.args[0].id}, {node.args[1].value!r})")
    return found


def test_no_private_name_crosses_a_module_boundary_tests_included():
    files = list(PACKAGE.rglob("*.py")) + list(TESTS.rglob("*.py"))
    found = {str(f.relative_to(PACKAGE.parent)): names for f in files if (names := private_names_across_modules(f))}
    assert not found, found


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
from lookahead.request import Request
from lookahead.sizing.cost import CostCurve, cost_curve
request = Request(drafter, sized=True)
plan = request.plan(8, CostCurve(cost_curve([1, 1, 1, 1, 1.2, 1.7, 2.7])))
assert 0 <= plan.size <= len(plan.chain)
request.verified(plan.draft.token_ids.tolist() + [5])
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
