"""The package's layout keeps its architecture visible: every module imports, no module imports
itself through others (at module level or inside a function, ``TYPE_CHECKING`` imports
included), modules stay short, and every assignment to another object's attribute is a patch the
registry lists (``patched_by``) or one on the package's own objects; no tracked file outside the
dated results names the test environment's private offline install."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

import sglang_dynamic_eagle
from sglang_dynamic_eagle.sglang_compat.registry import RELIANCES

PACKAGE = Path(sglang_dynamic_eagle.__file__).parent
NAME = "sglang_dynamic_eagle"
WORKER_MAX_LINES = 249
MODULE_MAX_LINES = 350
POLICY_REPLACED_LINES = 748  # auto_policy.py + cost_model.py, the rules the policy replaced
# Functions that assign attributes of the package's own objects, not of sglang's.
OWN_OBJECTS = {
    f"{NAME}.observability.prefill_timing.PrefillTimer.target_done": "its PrefillEvents",
    f"{NAME}.observability.prefill_timing.PrefillTimer.stop": "its PrefillEvents",
    f"{NAME}.sglang_compat.startup_errors.one_line_excepthook": "the hook it defines",
    f"{NAME}.engine.worker.DynamicEagleWorker.init_cuda_graphs": "its prefill timer's trace sink",
}
TOP_LEVEL, IN_FUNCTION = "top level", "in a function"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: Dict[str, Path] = {
    module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))
    if "__pycache__" not in path.parts
}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(module: str, node: ast.AST) -> List[str]:
    """The package's modules an import statement names (``from a import b`` names ``a.b`` where
    that is a module, else ``a``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        source = _absolute(module, node)
        names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                 for alias in node.names]
    else:
        return []
    found = []
    for name in names:
        while name and name not in MODULES:  # ``import a.b.c`` of a name inside a module
            name = name.rpartition(".")[0]
        if name.startswith(NAME) and name not in found:
            found.append(name)
    return found


def import_edges(module: str) -> Iterator[Tuple[str, str]]:
    """(imported module, TOP_LEVEL or IN_FUNCTION) for every package-internal import."""
    tree = ast.parse(MODULES[module].read_text())

    def visit(node: ast.AST, where: str) -> Iterator[Tuple[str, str]]:
        for target in imported_modules(module, node):
            yield target, where
        inner = IN_FUNCTION if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                  ast.Lambda)) else where
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inner)

    yield from visit(tree, TOP_LEVEL)


def import_graph(kinds: Set[str]) -> Dict[str, Dict[str, str]]:
    graph: Dict[str, Dict[str, str]] = {module: {} for module in MODULES}
    for module in MODULES:
        for target, where in import_edges(module):
            if where in kinds:
                graph[module].setdefault(target, where)
    return graph


def cycles(graph: Dict[str, Dict[str, str]]) -> List[List[str]]:
    """Every strongly connected component of more than one module, or with a self-import
    (Tarjan), each as its modules in order."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def describe(component: List[str], graph: Dict[str, Dict[str, str]]) -> str:
    edges = [f"{a} -> {b} ({graph[a][b]})" for a in component for b in graph[a]
             if b in component]
    return "; ".join(edges)


# --------------------------------------------------------------------------- imports


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_imports(module: str) -> None:
    importlib.import_module(module)


@pytest.mark.parametrize("kinds", [{TOP_LEVEL}, {TOP_LEVEL, IN_FUNCTION}],
                         ids=["top-level imports", "top-level and function-level imports"])
def test_no_import_cycles(kinds: Set[str]) -> None:
    graph = import_graph(kinds)
    assert [describe(component, graph) for component in cycles(graph)] == []


def test_the_cycle_check_sees_a_cycle() -> None:
    graph = {"a": {"b": TOP_LEVEL}, "b": {"c": IN_FUNCTION}, "c": {"a": TOP_LEVEL}, "d": {}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"a": TOP_LEVEL}}) == [["a"]]
    assert cycles({"a": {"b": TOP_LEVEL}, "b": {}}) == []


def test_the_import_graph_sees_type_checking_and_function_imports() -> None:
    edges = dict(import_edges(f"{NAME}.engine.plain_step"))
    assert edges[f"{NAME}.engine.plain_decode_graphs"] == TOP_LEVEL  # under TYPE_CHECKING
    plugin = dict(import_edges(f"{NAME}.sglang_compat.plugin"))
    assert plugin[f"{NAME}.engine.worker"] == IN_FUNCTION
    assert plugin[f"{NAME}.sglang_compat.registry"] == TOP_LEVEL


def impure_imports(module: str) -> List[str]:
    """What ``module`` imports that a pure policy may not: the package's modules outside
    ``policy`` (engine, sglang layer, observability), torch and sglang."""
    outside = [m for m, _ in import_edges(module) if not m.startswith(f"{NAME}.policy")]
    tree = ast.parse(MODULES[module].read_text())
    roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    roots |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and not node.level}
    return outside + sorted(roots & {"torch", "sglang"})


def test_the_policy_is_pure() -> None:
    """The policy (costs, acceptance, queue in; mode out) imports no other layer, no torch and
    no sglang: it runs, and replays traces, on any CPU."""
    impure = {m: impure_imports(m) for m in MODULES if m.startswith(f"{NAME}.policy")}
    assert {m: found for m, found in impure.items() if found} == {}
    assert {f"{NAME}.policy.throughput", f"{NAME}.policy.step_model"} <= set(impure)


def test_the_purity_check_sees_other_layers_torch_and_sglang() -> None:
    assert "sglang" in impure_imports(f"{NAME}.engine.worker")
    assert "torch" in impure_imports(f"{NAME}.engine.step_costs")
    assert f"{NAME}.observability.decision_log" in impure_imports(f"{NAME}.engine.observations")


# --------------------------------------------------------------------------- sizes


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_worker_is_short() -> None:
    assert line_count(PACKAGE / "engine" / "worker.py") <= WORKER_MAX_LINES


def test_the_policy_and_its_cost_model_are_shorter_than_the_rules_they_replaced() -> None:
    """Decisions, acceptance and step costs in fewer lines than the batch-size rules and cost
    table they replaced (748: docs/decisions.md, "Switching policy")."""
    files = ("throughput.py", "step_model.py", "acceptance.py")
    assert sum(line_count(PACKAGE / "policy" / name) for name in files) < POLICY_REPLACED_LINES


def test_no_module_is_long() -> None:
    long = {name: line_count(path) for name, path in MODULES.items()
            if line_count(path) > MODULE_MAX_LINES}
    assert long == {}


# --------------------------------------------------------------------------- patches


def attribute_assignments(module: str) -> Iterator[Tuple[str, str, int]]:
    """(qualified name of the enclosing function, ``base.attribute``, line) of every
    assignment to an attribute of an object other than ``self``."""
    tree = ast.parse(MODULES[module].read_text())

    def targets(node: ast.AST) -> Iterator[ast.AST]:
        if isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                yield from targets(element)
        else:
            yield node

    def visit(node: ast.AST, scope: List[str]) -> Iterator[Tuple[str, str, int]]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = scope + [node.name]
        assigned: List[ast.AST] = []
        if isinstance(node, ast.Assign):
            assigned = [t for target in node.targets for t in targets(target)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            assigned = [node.target]
        for target in assigned:
            if isinstance(target, ast.Attribute) and not (
                    isinstance(target.value, ast.Name) and target.value.id in ("self", "cls")):
                yield ".".join([module] + scope), ast.unparse(target), node.lineno
        for child in ast.iter_child_nodes(node):
            yield from visit(child, scope)

    yield from visit(tree, [])


def test_every_attribute_swap_is_in_the_registry() -> None:
    listed = {path for reliance in RELIANCES for path in reliance.patched_by}
    unlisted = [f"{function}: {target} (line {line})"
                for module in MODULES for function, target, line in attribute_assignments(module)
                if function not in listed and function not in OWN_OBJECTS]
    assert unlisted == []


def test_the_attribute_check_sees_a_swap() -> None:
    found = list(attribute_assignments(f"{NAME}.engine.plain_decode_graphs"))
    assert (f"{NAME}.engine.plain_decode_graphs.PlainDecodeGraphs.active",
            "runner.attn_backend") in [(function, target) for function, target, _ in found]


def test_no_setattr_and_no_class_swap() -> None:
    found = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                    node.func.id == "setattr"):
                found.append(f"{module}:{node.lineno} setattr")
            if isinstance(node, ast.Attribute) and node.attr == "__class__" and isinstance(
                    node.ctx, ast.Store):
                found.append(f"{module}:{node.lineno} __class__ =")
    assert found == []


def test_every_patching_function_is_where_the_registry_says() -> None:
    for reliance in RELIANCES:
        for path in reliance.patched_by:
            module = next((m for m in sorted(MODULES, key=len, reverse=True)
                           if path.startswith(m + ".")), None)
            assert module is not None, path
            functions = {function for function, _, _ in attribute_assignments(module)}
            hook: Optional[object] = importlib.import_module(module)
            for name in path[len(module) + 1:].split("."):
                hook = getattr(hook, name)
            assert callable(hook), path
            if reliance.kind == "attribute swap":
                assert path in functions, f"{path} assigns no attribute ({reliance.target})"


def test_the_benchmark_stays_one_small_driver() -> None:
    """benchmark/ Python (results aside) under 1,500 lines, one entry point (the four drivers it replaced
    held 3,091)."""
    root = Path(__file__).resolve().parents[1] / "benchmark"
    files = [root / "run.py", *sorted((root / "sweeplib").glob("*.py"))]
    assert sum(len(path.read_text().splitlines()) for path in files) < 1500
    assert sorted(p.name for p in root.glob("*.py")) == ["run.py"]


# Names of the test environment's private offline install, which the repository must not use
# outside its dated results (spelled apart so that this file does not match itself).
PRIVATE_NAMES = ("KIT" + "_DIR", "runtime" + " kit", "run_on" + "_device")


def files_naming(names, root: Path) -> List[str]:
    """Files git tracks under ``root`` (every file where it is no git checkout), results, weights
    and archives aside, whose text names any of ``names``, case-insensitive."""
    import subprocess

    try:
        listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
        paths = [root / line for line in listed.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in root.rglob("*") if "__pycache__" not in p.parts]
    found = []
    for path in sorted(paths):
        relative = path.relative_to(root)
        if (not path.is_file() or relative.parts[:2] == ("benchmark", "results")
                or path.suffix in (".safetensors", ".xz", ".pkl")):
            continue
        try:
            text = path.read_text().lower()
        except (UnicodeDecodeError, OSError):
            continue
        if any(name.lower() in text for name in names):
            found.append(str(relative))
    return found


def test_no_file_names_the_private_offline_install(tmp_path) -> None:
    assert files_naming(PRIVATE_NAMES, Path(__file__).resolve().parents[1]) == []
    (tmp_path / "doc.md").write_text("source $" + PRIVATE_NAMES[0] + "/setup.sh\n")  # the check sees one
    assert files_naming(PRIVATE_NAMES, tmp_path) == ["doc.md"]
