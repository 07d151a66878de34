"""The package arrows of docs/architecture.md, read from the source: models imports neither training nor service,
training never imports service, service never imports timm, transformers or training, the artifact contract imports
none of them (nor torch), benchmarks read data with the pipeline's readers only, the service's engine, observability
and feedback parts never import its API, the training stages import shared modules, never each other's entry points,
the post-hoc tools import none of the stages that build on them and the export imports nothing of the evaluation,
and no module imports itself back through others (no import cycle, lazy imports included); no module is over 400
lines and no function over 60."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "models": {"training", "service"},
    "training": {"service"},
    "service": {"training", "timm", "transformers"},
    "artifact": {"models", "training", "service", "torch", "timm", "transformers"},
}
# benchmarks drive the server as a process and load artifacts; of the pipeline they use its data readers only
BENCHMARK_TRAINING = "training.data"
# the service's parts: the API (routes, protocols) sits on the engine, observability and the feedback store
SERVICE_FORBIDDEN = {
    "service.engine": ("service.api", "service.app", "service.state"),
    "service.observability": ("service.api", "service.app", "service.state", "service.engine", "service.feedback"),
    "service.feedback": ("service.api", "service.app", "service.state", "service.engine"),
}
PACKAGES = ("artifact", "models", "training", "service", "benchmarks")
# each stage's entry point; what several stages share sits outside their sub-packages (training.posthoc, loading)
STAGES = {"training.fit.backbone", "training.distil.stage", "training.export.stage", "training.evaluate.stage",
          "training.baselines.export"}
# modules whose job is to run stages: the CLI, calibrate and its depth search, the ablation variants (distillations)
# and the ensemble members (fits)
ORCHESTRATORS = {"training.cli", "training.calibrate.stage", "training.calibrate.depth_search",
                 "training.evaluate.ablations", "training.baselines.builders"}

# the post-hoc tools (calibration, served statistics, OOD selection, ...) sit under export, evaluation and baselines,
# which use them as peers: export, evaluation and baselines never import each other's modules, save the evaluation
# comparing the baselines it fits
TRAINING_FORBIDDEN = {
    "training.posthoc": ("training.export", "training.evaluate", "training.baselines"),
    "training.export": ("training.evaluate", "training.baselines"),
    "training.evaluate": ("training.export",),
    "training.baselines": ("training.export", "training.evaluate"),
}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports (absolute names), wherever in the file the import sits."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_import_only_along_the_arrows(package: str) -> None:
    bad = {f"{path.relative_to(ROOT)}: {name}" for path in sorted((ROOT / package).rglob("*.py"))
           for name in imported_modules(path) if name.split(".")[0] in FORBIDDEN[package]}
    assert not bad, sorted(bad)


def test_training_stages_do_not_import_each_other() -> None:
    bad = []
    for path in sorted((ROOT / "training").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        others = (imported_modules(path) & STAGES) - {module}
        if module not in ORCHESTRATORS and others:
            bad.append(f"{module}: {sorted(others)}")
    assert not bad, bad


@pytest.mark.parametrize("part", sorted(TRAINING_FORBIDDEN))
def test_post_hoc_tools_sit_under_export_evaluation_and_baselines(part: str) -> None:
    folder = ROOT / part.replace(".", "/")
    bad = {f"{path.relative_to(ROOT)}: {name}" for path in sorted(folder.rglob("*.py"))
           for name in imported_modules(path)
           if any(name == f or name.startswith(f + ".") for f in TRAINING_FORBIDDEN[part])}
    assert not bad, sorted(bad)


def test_benchmarks_use_only_the_pipelines_data_readers() -> None:
    bad = {f"{path.relative_to(ROOT)}: {name}" for path in sorted((ROOT / "benchmarks").rglob("*.py"))
           for name in imported_modules(path)
           if name.split(".")[0] == "training" and not (name + ".").startswith(BENCHMARK_TRAINING + ".")}
    assert not bad, sorted(bad)


@pytest.mark.parametrize("part", sorted(SERVICE_FORBIDDEN))
def test_service_parts_never_import_the_api(part: str) -> None:
    folder = ROOT / part.replace(".", "/")
    bad = {f"{path.relative_to(ROOT)}: {name}" for path in sorted(folder.rglob("*.py"))
           for name in imported_modules(path)
           if any(name == f or name.startswith(f + ".") for f in SERVICE_FORBIDDEN[part])}
    assert not bad, sorted(bad)


def module_files() -> dict[str, Path]:
    """Every module of the project's packages by dotted name (a package by its ``__init__``)."""
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports: ``from a.b import c`` is an edge to ``a.b.c`` when that is a module,
    else to ``a.b``."""
    modules = module_files()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    edges.add(target if target in modules else node.module)
        graph[module] = {edge for edge in edges if edge in modules and edge != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60


def test_modules_and_functions_stay_small() -> None:
    """Outside tests, no module over 400 lines and no function over 60: one job each, readable in one sitting."""
    long_modules, long_functions = [], []
    for path in sorted(module_files().values()):
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            long_modules.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert not long_modules and not long_functions, long_modules + long_functions
