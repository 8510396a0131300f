"""The package reads bottom-up: each layer imports only the layers below it, and nothing forms a cycle.

Read from the source (every `import`, at the top of a module or inside a function; those under
`if TYPE_CHECKING:` aside, since they never run), so a lazy import that runs back up fails here too.
The engine (`minivllm`) never imports the lab (`minivllm_lab`: benchmarks, baselines, notebook helpers).
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Bottom to top: a module may import from its own layer or those below, never from above.
LAYERS = [
    ("config and params", ["minivllm.config", "minivllm.sampling_params", "minivllm.outputs", "minivllm.utils",
                           "minivllm.structured_outputs_params"]),
    ("kernels", ["minivllm.kernels"]),
    ("the distributed state", ["minivllm.distributed"]),
    ("layers", ["minivllm.layers"]),
    ("attention backends", ["minivllm.attention"]),
    ("models", ["minivllm.models"]),
    ("structured outputs", ["minivllm.structured_output"]),
    ("core", ["minivllm.core"]),
    ("worker", ["minivllm.worker"]),
    ("speculative decoding", ["minivllm.spec_decode"]),
    ("executor", ["minivllm.executor"]),
    ("engine", ["minivllm.engine"]),
    ("entrypoints", ["minivllm.chat", "minivllm.llm", "minivllm.server", "minivllm.cli", "minivllm.__main__",
                     "minivllm"]),
]


def module_names(package: str) -> dict[str, Path]:
    names = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


MODULES = module_names("minivllm") | module_names("minivllm_lab")


def imports_of(name: str, path: Path) -> set[str]:
    """The modules of this repository that `name` imports (a package's __init__ counts as the package)."""
    tree = ast.parse(path.read_text())
    skipped = {id(node) for stmt in ast.walk(tree)
               if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test)
               for node in ast.walk(stmt)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            # `from pkg import module` imports that module; `from module import name`, the module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # `from pkg import name`: the module that holds it
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def layer_of(module: str) -> int:
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    assert best is not None, f"{module} belongs to no layer: add it to LAYERS (and README's map)"
    return best[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read_from_the_source():
    """The reader must see real edges, or the tests below would pass on nothing."""
    assert "minivllm.core.scheduler" in GRAPH["minivllm.worker.model_runner"]
    assert "minivllm.worker.model_runner" in GRAPH["minivllm.executor.workers"]
    assert "minivllm.engine.llm_engine" in GRAPH["minivllm.llm"]


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("minivllm.") or n == "minivllm"))
def test_no_import_runs_up_a_layer(name):
    mine = layer_of(name)
    upward = {target: LAYERS[layer_of(target)][0] for target in GRAPH[name]
              if target.startswith("minivllm_lab") or layer_of(target) > mine}
    assert not upward, f"{name} ({LAYERS[mine][0]}) imports from above: {upward}"


def test_no_cycle_between_modules():
    assert cycles(GRAPH) == []


def test_no_cycle_between_subpackages():
    """Read one level up (minivllm.core, minivllm.worker, minivllm_lab.bench, ...), there is no cycle either."""
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])
    graph: dict[str, set[str]] = {}
    for name, targets in GRAPH.items():
        graph.setdefault(package(name), set()).update(package(t) for t in targets if package(t) != package(name))
    assert cycles(graph) == []


def test_the_engine_never_imports_the_lab():
    assert not [(n, t) for n, targets in GRAPH.items() if n.startswith("minivllm.") or n == "minivllm"
                for t in targets if t.startswith("minivllm_lab")]
