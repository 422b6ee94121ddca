"""The package's shape in numbers, for a renovation's before and after (issue 35).

    python bench/layout_counts.py            # table on stdout
    python bench/layout_counts.py --json c.json

- config-file opens in one preflight of configs/demo.yaml, per file (every `open` of a .json under
  the model folder, counted by wrapping io.open);
- variant-name literals ("wan2.1-t2v", ...) in the package outside the registry (vidgen/families.py; docstrings not counted);
- function-level imports of vidgen's own modules (an `import` inside a function body), and of others;
- the longest functions (lines from `def` to the last line of the body).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import collections
import io
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "vidgen"
REGISTRY = {PACKAGE / "families.py", PACKAGE / "config.py"}


def opens_per_preflight(config: Path) -> dict[str, int]:
    sys.path.insert(0, str(ROOT))
    from vidgen.preflight import preflight
    from vidgen.presets import load_config

    cfg = load_config(config)
    model = Path(cfg.model.path).resolve()
    counts: collections.Counter = collections.Counter()
    real_open, real_io_open = builtins.open, io.open

    def counting(file, *a, **k):
        try:
            p = Path(file).resolve()
            if p.suffix == ".json" and model in p.parents:
                counts[str(p.relative_to(model))] += 1
        except (TypeError, ValueError, OSError):
            pass
        return real_open(file, *a, **k)

    builtins.open = io.open = counting
    try:
        preflight(cfg)
    finally:
        builtins.open, io.open = real_open, real_io_open
    return dict(sorted(counts.items()))


def variant_literals() -> dict[str, int]:
    sys.path.insert(0, str(ROOT))
    try:
        from vidgen.families import FAMILIES as VARIANTS
    except ImportError:         # a tree from before vidgen.families (the 'before' count)
        from vidgen.config import VARIANTS

    pattern = re.compile("|".join(re.escape(v) for v in VARIANTS))
    found: collections.Counter = collections.Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in REGISTRY:
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                    and pattern.search(node.value)):
                found[str(path.relative_to(ROOT))] += 1
    return dict(found.most_common())


PLAN_FIELDS = {"placement", "weights", "text_encoder", "idle_expert", "idle_text"}


def plan_comparisons() -> dict[str, int]:
    """Comparisons of a memory-plan field with a string (`memory.placement == "stream_blocks"`) outside
    vidgen/memory.py (and the residency module, where they belong)."""
    found: collections.Counter = collections.Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("memory.py", "residency.py") and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if (any(isinstance(s, ast.Attribute) and s.attr in PLAN_FIELDS for s in sides)
                    and any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides)):
                found[str(path.relative_to(ROOT))] += 1
    return dict(found.most_common())


def function_imports() -> tuple[int, int]:
    ours = others = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    if node.level > 0 or (node.module or "").startswith("vidgen"):
                        ours += 1
                    else:
                        others += 1
                elif isinstance(node, ast.Import):
                    ours += sum(a.name.startswith("vidgen") for a in node.names)
                    others += sum(not a.name.startswith("vidgen") for a in node.names)
    return ours, others


def longest_functions(n: int = 10) -> list[tuple[int, str]]:
    rows = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                rows.append((fn.end_lineno - fn.lineno + 1, f"{path.relative_to(ROOT)}:{fn.name}"))
    return sorted(rows, reverse=True)[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    ap.add_argument("--json")
    args = ap.parse_args()
    ours, others = function_imports()
    out = {"opens": opens_per_preflight(Path(args.config)), "variant_literals": variant_literals(),
           "function_imports": {"vidgen": ours, "others": others}, "longest": longest_functions()}
    print("config-file opens in one preflight:", ", ".join(f"{k} {v}" for k, v in out["opens"].items()))
    lit = out["variant_literals"]
    cmp = plan_comparisons()
    print(f"string comparisons on memory-plan fields outside memory.py: {sum(cmp.values())} in {len(cmp)} files:",
          ", ".join(f"{k} {v}" for k, v in cmp.items()))
    print(f"variant literals outside vidgen/families.py: {sum(lit.values())} in {len(lit)} files:",
          ", ".join(f"{k} {v}" for k, v in lit.items()))
    print(f"function-level imports: {ours} of vidgen's own modules, {others} of others")
    print("longest functions:", ", ".join(f"{name} {n}" for n, name in out["longest"]))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
