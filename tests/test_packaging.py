"""The package list in pyproject.toml covers every package folder, kernel sources included."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "vidgen").rglob("__init__.py")}
    found |= {"vidgen._kernels" + "".join("." + q for q in p.parent.relative_to(ROOT / "kernels").parts)
              for p in (ROOT / "kernels").rglob("__init__.py")}
    assert listed == found
    assert cfg["package-dir"] == {"vidgen._kernels": "kernels"}
    assert cfg["package-data"]["vidgen._kernels"] == ["metal/*.metal"] and list((ROOT / "kernels/metal").glob("*.metal"))


def test_kernel_sources_import_lazily():
    """A CPU user never imports Triton: importing vidgen and decoding with torch ops leaves it out."""
    import subprocess
    import sys

    code = ("import sys, torch, vidgen, vidgen.vae, vidgen.ops as o; o.op_table('auto', 'cpu'); "
            "print(sorted(m for m in sys.modules if m == 'triton' or m.startswith('vidgen._kernels.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_bench_script_shadows_a_standard_module():
    """`python bench/x.py` puts bench/ first on sys.path: a bench/queue.py hid the standard `queue`
    from every other bench script (torch.export imports it)."""
    import sys

    shadowing = [p.name for p in (ROOT / "bench").glob("*.py") if p.stem in sys.stdlib_module_names]
    assert shadowing == []
