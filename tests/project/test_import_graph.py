"""The library's modules import each other in one direction: no circle, no deferral.

The graph is read from the source (``ast``), not from a run: an import inside a function
is an arrow like any other. Two rules:

* no circle among the library's modules (a package's ``__init__`` counts as a module, and
  importing ``a.b.c`` imports the package ``a.b`` first; imports under ``if
  TYPE_CHECKING:`` are for the type checker and those of a lazy ``__getattr__`` run after
  loading: neither counts);
* an import of the project's own modules inside a function is allowed only where it defers
  an optional dependency (the imported module needs torch, onnx, ... when it is loaded)
  or in a package's lazy ``__getattr__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"arrayprune": ROOT / "arrayprune", "arrayprune.adapters": ROOT / "adapters"}
OPTIONAL = {
    "cupy", "dask", "jax", "matplotlib", "onnx", "onnxruntime", "onnxscript", "safetensors", "scipy",
    "sentence_transformers", "threadpoolctl", "torch", "tqdm", "transformers",
}  # fmt: skip


def _modules() -> dict[str, tuple[Path, bool]]:
    found: dict[str, tuple[Path, bool]] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if package == "arrayprune" and parts[0] == "adapters":
                continue
            is_package = parts[-1] == "__init__"
            name = ".".join((package, *parts[:-1])) if is_package else ".".join((package, *parts))
            found[name] = (path, is_package)
    return found


class _Imports(ast.NodeVisitor):
    """Arrows (target, deferred, line, in_getattr) of one module to the library's modules."""

    def __init__(self, name: str, is_package: bool, modules: dict) -> None:
        self.name, self.is_package, self.modules = name, is_package, modules
        self.function: list[str] = []
        self.arrows: list[tuple[str, bool, int, bool]] = []
        self.optional = False

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.function.append(node.name)
        self.generic_visit(node)
        self.function.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def _arrow(self, target: str, line: int) -> None:
        while target not in self.modules and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in self.modules and target != self.name:
            deferred = bool(self.function)
            self.arrows.append((target, deferred, line, self.function[:1] == ["__getattr__"]))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.startswith("arrayprune"):
                self._arrow(alias.name, node.lineno)
            elif not self.function and alias.name.split(".")[0] in OPTIONAL:
                self.optional = True

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.name.split(".") if self.is_package else self.name.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
            if not self.function and module.split(".")[0] in OPTIONAL:
                self.optional = True
        if not module.startswith("arrayprune"):
            return
        for alias in node.names:
            full = f"{module}.{alias.name}"
            self._arrow(full if full in self.modules else module, node.lineno)


def _graph() -> tuple[dict[str, list[tuple[str, bool, int, bool]]], dict[str, bool]]:
    modules = _modules()
    arrows, optional = {}, {}
    for name, (path, is_package) in modules.items():
        visitor = _Imports(name, is_package, modules)
        visitor.visit(ast.parse(path.read_text(), str(path)))
        arrows[name], optional[name] = visitor.arrows + _parents(name, visitor.arrows, modules), visitor.optional
    return arrows, optional


def _parents(name: str, arrows: list, modules: dict) -> list[tuple[str, bool, int, bool]]:
    """The packages Python imports first for each arrow of `name` (``a.b`` for ``a.b.c``): an
    arrow to each, except to `name` itself and the packages holding it (already importing)."""
    holding = {name.rsplit(".", k)[0] for k in range(name.count(".") + 1)}
    out = []
    for target, deferred, line, in_getattr in arrows:
        parts = target.split(".")
        for k in range(1, len(parts)):
            package = ".".join(parts[:k])
            if package in modules and package not in holding and package != target:
                out.append((package, deferred, line, in_getattr))
    return out


def _circles(arrows: dict[str, list[tuple[str, bool, int, bool]]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in arrows:
        if root in index:
            continue
        work = [(root, iter(sorted({t for t, *_ in arrows[root]})))]
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
                    work.append((child, iter(sorted({t for t, *_ in arrows[child]}))))
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
                    circles.append(sorted(component))
    return circles


def _needs_optional(name: str, arrows: dict, optional: dict[str, bool]) -> bool:
    """Whether loading `name` (its top-level imports, transitively) loads an optional dependency."""
    seen, todo = {name}, [name]
    while todo:
        module = todo.pop()
        if optional[module]:
            return True
        parents = [module.rsplit(".", i)[0] for i in range(1, module.count(".") + 1)]
        for target in [t for t, deferred, *_ in arrows[module] if not deferred] + parents:
            if target in arrows and target not in seen:
                seen.add(target)
                todo.append(target)
    return False


def test_the_library_imports_in_one_direction():
    arrows, _ = _graph()
    # A lazy ``__getattr__`` imports when a name is first read, after every import is done.
    loading = {name: [a for a in out if not a[3]] for name, out in arrows.items()}
    assert _circles(loading) == []


def test_own_modules_are_imported_at_the_top_unless_an_optional_dependency_is_deferred():
    arrows, optional = _graph()
    deferred = [
        f"{name}:{line} imports {target} inside a function"
        for name, out in sorted(arrows.items())
        for target, is_deferred, line, in_getattr in out
        if is_deferred and not in_getattr and not _needs_optional(target, arrows, optional)
    ]
    assert deferred == []


#: The layers of :mod:`arrayprune.adapters.pipeline`, bottom first (its docstring draws
#: them): a module imports modules of its own layer or of those below.
PIPELINE_LAYERS = (
    ("errors", "hooks", "devices"),
    ("request", "method_names", "allocation_request", "shrink_request", "reconstruction_methods"),
    ("calibration", "hf_calibration", "hf_structure", "onnx_stages", "reconstruction", "stream_pruning"),
    ("storage", "scoring", "prune_result", "targets", "outputs", "option_files", "scan", "hf_scan", "job",
     "evaluate", "shrink_folder"),
    ("hf_stage", "reconstruct_stage", "verify_stage", "shrink_checkpoint", "shrink_structure", "layer_choice"),
    ("calibrate", "allocation", "shrinking"),
    ("runner",),
)  # fmt: skip


def _upward(arrows: dict, layers: tuple, package: str) -> list[str]:
    level = {f"{package}.{m}": i for i, layer in enumerate(layers) for m in layer}
    return [
        f"{name} (layer {level[name]}) imports {target} (layer {level[target]})"
        for name, out in sorted(arrows.items())
        if name in level
        for target, *_ in out
        if target in level and level[target] > level[name]
    ]


def test_the_pipeline_imports_down_its_layers():
    arrows, _ = _graph()
    package = "arrayprune.adapters.pipeline"
    modules = {n.rpartition(".")[2] for n in arrows if n.startswith(package + ".")}
    assert modules == {m for layer in PIPELINE_LAYERS for m in layer}  # every module has its layer
    assert _upward(arrows, PIPELINE_LAYERS, package) == []
    # The stages (the layer below the runner) are independent: none imports another.
    stages = {f"{package}.{m}" for m in PIPELINE_LAYERS[-2]}
    assert [(n, t) for n in sorted(stages) for t, *_ in arrows[n] if t in stages] == []
    # They take the job, not the request: none imports the request module or the command line.
    above = (f"{package}.request", "arrayprune.adapters.cli")
    assert [(n, t) for n in sorted(stages) for t, *_ in arrows[n] if t.startswith(above)] == []


def test_the_checks_can_fail():
    arrows = {"a": [("b", False, 1, False)], "b": [("c", True, 1, False)], "c": [("a", False, 1, False)], "d": []}
    assert _circles(arrows) == [["a", "b", "c"]]
    optional = {"a": False, "b": True, "c": False, "d": False}
    assert _needs_optional("a", arrows, optional) and not _needs_optional("c", {**arrows, "a": []}, optional)
    assert _upward(arrows, (("c",), ("b",), ("a",)), "p") == []
    layered = {"p.a": [("p.b", False, 1, False)], "p.b": []}
    assert _upward(layered, (("a",), ("b",)), "p") == ["p.a (layer 0) imports p.b (layer 1)"]
