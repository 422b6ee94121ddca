"""The one error hierarchy of vidgen; the CLI maps each class to an exit code.

Exit codes: 0 ok, 1 internal error (a bug: traceback with --debug), 2 bad input (something the
user can fix: config, model folder, image, output path), 3 blocked by the guardrail.
"""

from __future__ import annotations


class VidgenError(Exception):
    """Base class: a problem the user can act on, shown as one line without a traceback."""

    exit_code = 2


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
