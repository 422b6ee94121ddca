"""The package's shape: no import cycles, config.py a leaf, no oversized module, and the parts that
must import without torch do."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "vidgen"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The vidgen modules `name` imports (at any depth of its code: lazy imports count too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [target] + [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        deps |= {c for c in candidates if c in modules and c != name}
    return deps


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = iter(range(len(graph) * 2))

    def visit(v):
        index[v] = low[v] = next(counter)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_and_config_is_a_leaf():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []
    assert graph["vidgen.config"] == {"vidgen.errors", "vidgen.budgets", "vidgen.codecs", "vidgen.families", "vidgen.fields",
                                      "vidgen.text", "vidgen.output_config", "vidgen.animate_config"}
    assert graph["vidgen.output_config"] == {"vidgen.codecs", "vidgen.fields"}
    assert graph["vidgen.animate_config"] == {"vidgen.fields"}
    assert graph["vidgen.fields"] == set()
    assert graph["vidgen.codecs"] == set()
    assert graph["vidgen.budgets"] == {"vidgen.errors"}
    assert graph["vidgen.families"] == set()      # a leaf too: config takes the variant names from it
    assert graph["vidgen.text"] == set()
    assert _cycles({**graph, "vidgen.demo": {"vidgen.config"}, "vidgen.config": {"vidgen.demo"}})   # the check finds one


def test_no_module_is_oversized():
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {name: n for name, n in sizes.items() if n > 600} == {}
    assert sizes["vidgen.pipeline"] <= 450


def test_the_queue_api_imports_without_torch():
    """`vidgen queue submit` and the service's handlers start from vidgen.queue.api: no torch, no
    diffusers before a config passes its checks."""
    code = "import sys, vidgen.queue.api; print(sorted({'torch', 'diffusers', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_one_variants_dir():
    """The shipped JSON folders are found through one name (vidgen.families.VARIANTS_DIR)."""
    import re

    root = Path(__file__).resolve().parent.parent
    found = [str(p.relative_to(root)) for p in (root / "vidgen").rglob("*.py")
             if re.search(r'/ "variants"', p.read_text())]
    assert found == ["vidgen/families.py"]


def test_the_workflow_schema_imports_without_torch():
    code = "import sys, vidgen.queue.workflow, vidgen.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_readme_names_every_module():
    """README's layout names each module of vidgen/ (`queue/ledger.py`, a package's __init__ as `guard/`),
    and nothing that is not there."""
    import re

    root = Path(__file__).resolve().parent.parent
    text = (root / "README.md").read_text()
    section = text.split("Where things are in `vidgen/`", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([\w/]+(?:\.py|/))`", section))
    modules = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.name == "__init__.py":
            if rel.parent != Path("."):
                modules.add(f"{rel.parent.as_posix()}/")
        elif rel.as_posix() != "__main__.py":
            modules.add(rel.as_posix())
    assert sorted(modules - named) == [], "modules the README's layout does not name"
    assert sorted(named - modules) == [], "names in the README's layout that are not modules"
