"""The one error hierarchy of vidgen; the CLI maps each class to an exit code.

Exit codes: 0 ok, 1 internal error (a bug: traceback with --debug), 2 bad input (something the
user can fix: config, model folder, image, output path), 3 blocked by the guardrail.
"""

from __future__ import annotations

import functools
import json
import shlex
from pathlib import Path
from urllib.parse import unquote, urlparse


class VidgenError(Exception):
    """Base class: a problem the user can act on, shown as one line without a traceback."""

    exit_code = 2


class EnvironmentProblem(VidgenError):
    """This machine lacks what a run needs (a package, an extra not installed, a device): the job or
    config is fine and runs where that is present. A queue worker gives such a job back instead of
    failing it (queue.executor.environment_problem also counts ImportErrors and CUDA start-up errors)."""


class ConfigError(VidgenError):
    """The config (file, overrides or API arguments) is invalid. Holds every problem found."""

    def __init__(self, problems: list[str] | str, source: str | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        if len(self.problems) == 1:
            msg = f"invalid config{where}: {self.problems[0]}"
        else:
            msg = f"invalid config{where} ({len(self.problems)} problems): " + "; ".join(self.problems)
        super().__init__(msg)


class ModelLoadError(VidgenError):
    """The model folder is missing, incomplete, or holds something vidgen cannot load."""


class DeviceUnavailable(ModelLoadError, EnvironmentProblem):
    """The config asks for a device (cuda, mps) this machine does not have."""


class PackageMissing(ModelLoadError, EnvironmentProblem):
    """A package the model or the guard needs (one of vidgen's extras) is not installed, or broken."""


class InputError(VidgenError):
    """An input file (conditioning image, latents file) is missing or unreadable."""


class OutputError(VidgenError):
    """The output cannot be written (unwritable folder, existing file, encoder failure)."""


class NonFiniteOutput(VidgenError):
    """The transformer produced NaN or infinite values: the render stops there instead of writing a
    black or broken video; the message names the step and the speed settings to change."""


class GuardrailBlocked(VidgenError):
    """The guardrail refused the prompt or the frames; `report` holds the scores per check."""

    exit_code = 3

    def __init__(self, message: str, report: dict | None = None):
        super().__init__(message)
        self.report = report or {}


class GuardrailUnavailable(VidgenError):
    """An enabled guardrail check cannot run (model missing, backend error): the guard fails closed,
    nothing is published, and the message says how to fix the setup or disable that check."""


class MissingExtra(ConfigError, EnvironmentProblem):
    """A setting needs a package of one of vidgen's extras that is not installed; the message says
    how to install it (install_hint)."""


_DEVICE_START = ("Torch not compiled with CUDA", "No CUDA GPUs are available", "no NVIDIA driver",
                 "CUDA driver version is insufficient", "no CUDA-capable device", "cannot open shared object file")
"""What torch (or a native library) says when this machine has no usable CUDA or a library is missing."""


def environment_problem(e: BaseException) -> str | None:
    """The one-line reason when `e` says this machine lacks something (EnvironmentProblem, an
    ImportError anywhere in its chain, CUDA that does not start), not that the job or config is
    wrong; None otherwise. A VidgenError's own message (it says how to fix it) is the reason, else
    the innermost such error's."""
    found, x, seen = None, e, set()
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if isinstance(x, (EnvironmentProblem, ImportError)) or (
                isinstance(x, (RuntimeError, AssertionError, OSError)) and any(s in str(x) for s in _DEVICE_START)):
            found = x
        x = x.__cause__ or x.__context__
    if found is None:
        return None
    shown = e if isinstance(e, VidgenError) else found
    text = str(shown) if isinstance(shown, VidgenError) else f"{type(shown).__name__}: {shown}"
    return next((line.strip() for line in text.splitlines() if line.strip()), type(shown).__name__)


@functools.cache
def _checkout() -> tuple[str, bool] | None:
    """(the folder vidgen was installed from, whether editable), from the installed distribution's
    direct_url.json (PEP 610: written by `pip install -e .` and `pip install /path`), else the
    source tree vidgen runs from; None for an install from an archive, or when that folder is gone."""
    import importlib.metadata

    here = Path(__file__).resolve().parent
    for dist in importlib.metadata.distributions(name="vidgen"):   # an egg-info in the cwd may come first
        try:
            info = json.loads(dist.read_text("direct_url.json") or "null")
        except ValueError:
            continue
        url = urlparse(info.get("url", "")) if isinstance(info, dict) else None
        if url is None or url.scheme != "file":
            continue
        root = Path(unquote(url.path))
        editable = bool((info.get("dir_info") or {}).get("editable"))
        if (root / "pyproject.toml").is_file() and (not editable or root.resolve() == here.parent):
            return str(root), editable
    if (here.parent / "pyproject.toml").is_file():    # run from a source tree without an install
        return str(here.parent), True
    return None


def install_hint(extra: str) -> str:
    """How to install this project's `extra`, never a package index's `vidgen` (another project of
    that name is there): `pip install -e '/path/to/checkout[serve]'` for the checkout vidgen was
    installed from, else the command to run in it."""
    found = _checkout()
    if found is None:
        return f"from your vidgen checkout: pip install -e '.[{extra}]'"
    root, editable = found
    return f"pip install {'-e ' if editable else ''}{shlex.quote(f'{root}[{extra}]')}"
