"""The package list in pyproject.toml covers every package folder, kernel sources included."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "vidgen").rglob("__init__.py")}
    found |= {"vidgen._kernels." + ".".join(p.parent.relative_to(ROOT / "kernels").parts)
              for p in (ROOT / "kernels").rglob("__init__.py")}
    assert listed == found
    assert cfg["package-dir"] == {"vidgen._kernels.triton": "kernels/triton", "vidgen._kernels.metal": "kernels/metal"}
    assert cfg["package-data"]["vidgen._kernels.metal"] == ["*.metal"] and list((ROOT / "kernels/metal").glob("*.metal"))


def _importable_from_root() -> set[str]:
    """Top-level names that `python -m ...` from the repository root can import as ours: regular
    packages (a folder with __init__.py) and modules (a .py file). A bare folder is only a PEP 420
    portion, which any installed module of that name shadows."""
    names = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    names |= {p.stem for p in ROOT.glob("*.py")}
    return names


def test_no_top_level_name_shadows_an_installed_distribution():
    """transformers 5.25 requires Hugging Face's `kernels`; a kernels/__init__.py at the root made
    `python -m vidgen` and `python -m pytest` import our folder in its place (issue 34)."""
    import importlib.metadata

    ours = _importable_from_root()
    assert ours == {"vidgen"}, f"importable from the repository root: {sorted(ours)}"
    theirs = {name for name, dists in importlib.metadata.packages_distributions().items()
              if any(d.lower() != "vidgen" for d in dists)}
    assert not (ours & theirs), f"shadows an installed distribution: {sorted(ours & theirs)}"
    assert not (ROOT / "kernels" / "__init__.py").exists()


def test_kernels_from_the_root_is_the_installed_distribution():
    """From the root (cwd first on sys.path, as `python -m` puts it), `kernels` is Hugging Face's
    where it is installed, and our sources still load as vidgen._kernels."""
    import importlib.util
    import subprocess
    import sys

    code = ("import importlib.util as u, vidgen._kernels.triton, vidgen._kernels.metal as m, importlib.resources as r; "
            "s = u.find_spec('kernels'); print(s.origin if s else None); "
            "print((r.files(m) / 'vae_ops.metal').is_file())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
    assert out[1] == "True"
    if importlib.util.find_spec("kernels") is None:
        return  # no such distribution here: the bare folder is a namespace portion, nothing of ours runs
    assert out[0] != "None" and not out[0].startswith(str(ROOT / "kernels")), out[0]


def test_kernel_sources_import_lazily():
    """A CPU user never imports Triton: importing vidgen and decoding with torch ops leaves it out."""
    import subprocess
    import sys

    code = ("import sys, torch, vidgen, vidgen.vae, vidgen.ops as o; o.op_table('auto', 'cpu'); "
            "print(sorted(m for m in sys.modules if m == 'triton' or m.startswith('vidgen._kernels.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_bench_script_shadows_a_standard_or_installed_module():
    """`python bench/x.py` puts bench/ first on sys.path: a bench/queue.py hid the standard `queue`
    from every other bench script (torch.export imports it), and bench/kernels.py hid Hugging Face's
    `kernels`, which transformers imports (bench/memory.py failed to load any model)."""
    import importlib.metadata
    import sys

    installed = set(importlib.metadata.packages_distributions())
    shadowing = [p.name for p in (ROOT / "bench").glob("*.py")
                 if p.stem in sys.stdlib_module_names or p.stem in installed]
    assert shadowing == []


def test_install_hints_name_this_checkout_never_the_index():
    """A package index holds another project called `vidgen`: `pip install 'vidgen[serve]'` installs
    someone else's code. Every hint in the package comes from errors.install_hint (issue 34)."""
    import re

    bad = re.compile(r"pip install\s+['\"]?vidgen\b|['\"]vidgen\[|pip install[^\n]*\[")     # an extra by hand
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in (ROOT / "vidgen").rglob("*.py")
             if p.name != "errors.py" for i, line in enumerate(p.read_text().splitlines(), 1) if bad.search(line)]
    assert found == []


def test_install_hint_names_the_checkout_it_was_installed_from(monkeypatch, tmp_path):
    """pip's direct_url.json (PEP 610) names the folder of `pip install -e .`; without one, the hint
    says to run pip in the checkout."""
    import importlib.metadata
    import json

    from vidgen import errors

    class Dist:
        def __init__(self, info):
            self.info = info

        def read_text(self, name):
            return json.dumps(self.info) if name == "direct_url.json" and self.info is not None else None

    checkout = tmp_path / "my vidgen"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text("[project]\nname = 'vidgen'\n")

    def hint(*dists, package=tmp_path / "vidgen"):
        errors._checkout.cache_clear()
        monkeypatch.setattr(importlib.metadata, "distributions", lambda name=None: list(dists))
        monkeypatch.setattr(errors, "__file__", str(package / "errors.py"))
        try:
            return errors.install_hint("serve")
        finally:
            errors._checkout.cache_clear()

    # this environment: installed editable from this checkout (the README's `pip install -e .`)
    assert errors.install_hint("ray") == f"pip install -e '{ROOT}[ray]'"
    url = checkout.as_uri()
    editable = Dist({"url": url, "dir_info": {"editable": True}})
    assert hint(Dist(None), editable, package=checkout / "vidgen") == f"pip install -e '{checkout}[serve]'"
    assert hint(Dist(None), Dist({"url": url, "dir_info": {}})) == f"pip install '{checkout}[serve]'"
    # an editable install is only believed when the package runs from that folder
    fallback = "from your vidgen checkout: pip install -e '.[serve]'"
    assert hint(editable) == fallback
    assert hint(Dist({"url": "https://example.org/vidgen.tar.gz"})) == fallback
    assert hint(package=ROOT / "vidgen") == f"pip install -e '{ROOT}[serve]'"      # a source tree, not installed


def test_missing_extras_say_how_to_install_them_from_this_checkout(monkeypatch, tmp_path):
    """The service without starlette/uvicorn and the Ray worker without Ray: one line naming the
    extra to install from this checkout, an EnvironmentProblem (a queue worker gives its job back)."""
    import builtins

    import pytest

    from vidgen.errors import EnvironmentProblem, install_hint
    from vidgen.queue.ray_backend import run_ray_dispatcher
    from vidgen.queue.service import serve

    real = builtins.__import__

    def without(*names):
        def imp(name, *a, **k):
            if name.split(".")[0] in names:
                raise ImportError(f"No module named {name!r}")
            return real(name, *a, **k)
        return imp

    monkeypatch.setattr(builtins, "__import__", without("uvicorn"))
    with pytest.raises(EnvironmentProblem, match="the service needs its extra") as e:
        serve(tmp_path / "q.db")
    assert str(e.value).endswith(install_hint("serve"))
    monkeypatch.setattr(builtins, "__import__", without("ray"))
    with pytest.raises(EnvironmentProblem, match="needs Ray") as e:
        run_ray_dispatcher(tmp_path / "q.db")
    assert str(e.value).endswith(install_hint("ray"))
