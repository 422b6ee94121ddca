"""`vidgen` command line: render, decode, plan, config show, guard, queue, info, verify — a thin layer over the Python API.

Exit codes: 0 ok; 2 bad input (one line, no traceback); 3 blocked by the guardrail;
1 internal error (traceback with --debug), or a file that fails `vidgen verify`; 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import traceback
from pathlib import Path

from .budgets import format_bytes
from .quiet import libraries, quiet_libraries
from .errors import ConfigError, InputError, VidgenError

log = logging.getLogger("vidgen")


class _Bars:
    """Draws one tqdm bar per stage from the pipeline's progress callback."""

    def __init__(self, enabled: bool):
        self.enabled, self.bar, self.stage = enabled, None, None

    def __call__(self, p) -> None:
        if not self.enabled or p.stage == "encode":
            return
        from tqdm import tqdm

        if p.stage != self.stage:
            self.close()
            unit = "step" if p.stage == "denoise" else "frame"
            self.bar = tqdm(total=p.total, desc=f"{p.stage:>7}", unit=unit, leave=True, dynamic_ncols=True)
            self.stage = p.stage
        self.bar.n = p.step
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar, self.stage = None, None


class _LogLines(logging.StreamHandler):
    """vidgen's log on stderr, one line each: `vidgen: MESSAGE`, `vidgen: warning: MESSAGE` for a
    warning; written above the progress bars (tqdm.write), never into one."""

    def format(self, record: logging.LogRecord) -> str:
        return ("vidgen: warning: " if record.levelno == logging.WARNING else "vidgen: ") + record.getMessage()

    def emit(self, record: logging.LogRecord) -> None:
        tqdm = sys.modules.get("tqdm")      # only if the bars are in use
        if tqdm is None:
            return super().emit(record)
        try:
            tqdm.tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


LIGHT = {("config", "show"), ("queue", "list"), ("queue", "show"), ("queue", "cancel"), ("queue", "retry"),
         ("queue", "logs"), ("queue", "pause"), ("queue", "resume"), ("verify", None)}
"""Commands that read configs or the ledger and load no model: they do not import diffusers and
transformers only to silence them (about 5 s of a `vidgen queue list` on a 2-core CPU)."""
VALIDATE_FIRST = {("render", None), ("plan", None), ("queue", "submit")}
"""Commands that load and check their config before they import a model library (8-10 s -> under
a second for a config error or a missing file on a 2-core CPU), then silence the libraries
(quiet.libraries)."""


def _report(result) -> None:
    t = ", ".join(f"{k} {v:.1f}s" for k, v in result.timings.items())
    print(f"wrote {result.path} ({result.num_frames} frames, {result.width}x{result.height} @ {result.fps} fps, "
          f"seed {result.seed}; {t}; peak memory {result.peak_memory_bytes / 2**20:.0f} MiB {result.peak_memory_kind})")


class _Interrupt:
    """Ctrl-C while sampling stops after the current step, which the pipeline then checkpoints (it
    does on StopRender); a second Ctrl-C, or one before or after sampling, stops at once."""

    def __init__(self, bars: _Bars):
        self.bars, self.stage, self.step, self.total, self.asked = bars, None, 0, 0, False

    def __call__(self, p) -> None:          # the render's progress callback
        self.stage, self.step, self.total = p.stage, p.step, p.total
        self.bars(p)
        if self.asked and p.stage == "denoise" and 0 < p.step < p.total:
            from .pipeline import StopRender

            raise StopRender("interrupt")

    def signal(self, signum, frame) -> None:
        if self.asked or self.stage != "denoise" or self.step >= self.total:
            raise KeyboardInterrupt
        self.asked = True
        log.info("stopping after this step, with a checkpoint to resume from (Ctrl-C again: at once)")

    def __enter__(self) -> _Interrupt:
        import signal
        import threading

        self.old = None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGINT, self.signal)
        return self

    def __exit__(self, *exc) -> None:
        import signal

        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)


def _resume_hint(args, cfg, stop: _Interrupt) -> str:
    """`vidgen: interrupted ...`, with the command that resumes when a checkpoint of this render is there."""
    from .resume import find

    where = f" at step {stop.step} of {stop.total}" if stop.stage == "denoise" else ""
    try:
        path = find(cfg) if stop.stage == "denoise" else None
    except InputError:
        path = None
    if path is None:
        return f"vidgen: interrupted{where}"
    argv = ["vidgen", *(["--debug"] if args.debug else []), "render", args.config, *args.overrides,
            *(["-q"] if args.quiet else []), f"--resume={path}"]
    return f"vidgen: interrupted{where}; resume with: {shlex.join(argv)}"


def cmd_render(args) -> int:
    from .presets import load_config

    cfg = load_config(args.config, args.overrides)      # a config error costs no model library import
    libraries(args)
    from .launch import render
    from .pipeline import StopRender
    from .threads import set_cpu_threads

    set_cpu_threads(cfg, log=log)
    bars = _Bars(not args.quiet)
    with _Interrupt(bars) as stop:
        try:
            result = render(cfg, callback=stop, resume=args.resume)
        except (StopRender, KeyboardInterrupt):
            bars.close()
            print(_resume_hint(args, cfg, stop), file=sys.stderr)
            return 130
        finally:
            bars.close()
    _report(result)
    if result.latents_path:
        print(f"latents: {result.latents_path}")
    return 0


def cmd_decode(args) -> int:
    from .pipeline import decode_latents

    bars = _Bars(not args.quiet)
    try:
        result = decode_latents(args.latents, overrides=args.overrides, callback=bars)
    finally:
        bars.close()
    _report(result)
    return 0


def cmd_plan(args) -> int:
    import json

    from .presets import load_config

    cfg = load_config(args.config, ["prompt=(planning)", *args.overrides])     # a plan needs no prompt
    libraries(args)                    # after the config's checks: an error there costs no torch import
    from .memory import plan_render, planning_device

    # a budget given on a machine without a GPU means the GPU's
    device, note = _plan_device(cfg, planning_device(cfg))
    if note:
        log.info("%s", note)
    if cfg.animate.pose_video:          # an Animate clip has the pose video's frames (the host's frames count them)
        from dataclasses import replace

        from .animate_inputs import scan_clip
        cfg = replace(cfg, num_frames=scan_clip(cfg.animate.pose_video, "animate.pose_video").frames)
    planned = plan_render(cfg, device=device)       # with a cache (memo.Memo) of its own
    if args.json:
        out = planned.chosen.to_json()
        if args.all:
            out["tried"] = [p.to_json() for p in planned.tried]
        print(json.dumps(out, indent=2))
        return 0
    if args.all:
        for p in planned.tried[:-1]:
            print(f"{p.table()}\n")
    print(planned.chosen.table())
    return 0


def _plan_device(cfg, device):
    """The device `vidgen plan` plans for (a torch.device; `device`: model.device's), and a one-line note
    when it is not the one a render here would use: with model.device auto, an explicit
    memory.device_budget and no GPU on this machine, the budget means a GPU's, so the plan is a CUDA
    render's (model.dtype auto: bfloat16), as on that GPU."""
    import torch

    from .loading import resolve_dtype

    if device.type != "cpu" or cfg.model.device != "auto" or cfg.memory.device_budget == "auto":
        return device, ""
    cuda = torch.device("cuda")
    host = ("" if cfg.memory.host_budget != "auto" else
            "; memory.host_budget auto is this machine's available RAM: set it to the GPU machine's")
    dtype = str(resolve_dtype(cfg.model.dtype, cuda)).removeprefix("torch.")
    return cuda, (f"no GPU here, so planning for a CUDA GPU ({dtype}) with memory.device_budget "
                  f"{format_bytes(cfg.memory.device_budget)}; model.device=cpu plans a render on this CPU{host}")


def cmd_config_show(args) -> int:
    from .presets import load_config, to_yaml

    print(to_yaml(load_config(args.config, args.overrides)), end="")
    return 0


def cmd_info(args) -> int:
    import importlib.util

    import torch

    from . import __version__

    if args.model:
        from .sources import describe_model

        print(describe_model(args.model))
        return 0

    def has(mod: str) -> bool:
        return importlib.util.find_spec(mod) is not None

    lines = [f"vidgen {__version__}", f"python {sys.version.split()[0]}", f"torch {torch.__version__}"]
    for mod in ("diffusers", "transformers", "av", "onnxruntime"):
        try:
            lines.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:
            lines.append(f"{mod} not installed")
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if mps:
        devices.append("mps")
    lines.append("devices: " + ", ".join(devices))
    kernels = ["torch"] + (["triton"] if has("triton") and torch.cuda.is_available() else []) + (["metal"] if mps else [])
    lines.append("kernel backends: " + ", ".join(kernels))
    guard = ["torch"]
    if has("onnxruntime"):
        import onnxruntime

        guard.append("onnxruntime (" + ", ".join(onnxruntime.get_available_providers()) + ")")
    if has("tensorrt"):
        guard.append("tensorrt")
    lines.append("guard backends: " + ", ".join(guard))
    print("\n".join(lines))
    return 0


def cmd_models(args) -> int:
    from .sources import MODEL_DIRS_ENV, hub_cache, list_models

    rows = list_models(args.folders)
    if not rows:
        print(f"no Wan models in the Hugging Face cache ({hub_cache()}) or in ${MODEL_DIRS_ENV}")
        return 0
    width = min(max(len(r[0]) for r in rows), 80)
    for where, what, variant in rows:
        print(f"{where:<{width}}  {what:<40}  {variant}")
    return 0


def cmd_guard_check(args) -> int:
    import json

    from .guard import check_video, load_guard_config

    cfg = load_guard_config(args.overrides)
    if not Path(args.video).exists():
        raise InputError(f"{args.video}: no such video file or PNG folder")
    report = check_video(args.video, cfg)
    if args.json:
        print(json.dumps({"video": str(args.video), **report.to_dict()}, indent=2))
    else:
        print(f"{'FLAGGED' if report.flagged else 'safe'}: {args.video}: {report.summary()}")
    return 3 if report.flagged else 0


def cmd_guard_export(args) -> int:
    from .guard import load_guard_config
    from .guard.backends import export_command
    from .guard.classifier import CLASSIFIERS

    cfg = load_guard_config(args.overrides)
    if cfg.classifier not in CLASSIFIERS:
        raise ConfigError(f"guard.classifier: {cfg.classifier!r} is not a registered classifier "
                          f"({', '.join(CLASSIFIERS)}); an .onnx classifier needs no export")
    path = export_command(CLASSIFIERS[cfg.classifier](), args.out, fp16=cfg.precision == "fp16")
    print(f"wrote {path}")
    return 0


def cmd_guard_build_engine(args) -> int:
    from .guard import load_guard_config
    from .guard.backends import build_engine_command

    cfg = load_guard_config(args.overrides)
    path = build_engine_command(args.onnx, cfg.precision, cfg.batch_size, cfg.engine_cache or None)
    print(f"engine: {path}")
    return 0


def cmd_verify(args) -> int:
    import json

    from .provenance import verify

    report = verify(args.file, trust=args.trust)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif report.ok:
        print("\n".join(report.lines))
    if not report.ok:
        print(f"vidgen: error: {args.file} fails verification: {'; '.join(report.problems)}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vidgen", description="Render video with Wan2.1/Wan2.2 pipelines.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("render", help="render a clip from a YAML config",
                       description="vidgen render CONFIG [KEY=VALUE ...], e.g. sampling.steps=20 prompt='a fox'")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="config overrides as KEY=VALUE (OmegaConf dotlist)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.add_argument("--resume", nargs="?", const=True, metavar="CHECKPOINT",
                   help="continue an interrupted render (default: this output's checkpoint, else the newest one that "
                        "matches); put it last, or write --resume=PATH")
    p.set_defaults(fn=cmd_render)

    p = sub.add_parser("decode", help="finish a render from its saved .latents.safetensors file")
    p.add_argument("latents")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. output.path=other.mp4")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=cmd_decode)

    p = sub.add_parser("plan", help="the render's memory plan (device and host, every stage), before any weight loads",
                       description="vidgen plan CONFIG [KEY=VALUE ...] [--json]: works from the model folder's JSON "
                                   "files, or from model.variant alone before a download")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. memory.device_budget=24GiB size=1280x720")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("--all", action="store_true", help="also the candidates tried before the chosen one")
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("config", help="inspect configs")
    csub = p.add_subparsers(dest="config_command", required=True)
    s = csub.add_parser("show", help="print the merged, validated config")
    s.add_argument("config")
    s.add_argument("overrides", nargs="*")
    s.set_defaults(fn=cmd_config_show)

    p = sub.add_parser("guard", help="the guardrail: check a video, export the classifier, build a TensorRT engine")
    gsub = p.add_subparsers(dest="guard_command", required=True)
    s = gsub.add_parser("check", help="run the frame checks on a video (exit 0 safe, 3 flagged)",
                        description="vidgen guard check VIDEO [guard.KEY=VALUE ...] [--json]")
    s.add_argument("video")
    s.add_argument("overrides", nargs="*", help="guard settings, e.g. guard.threshold=0.6 guard.photosensitivity=false")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.set_defaults(fn=cmd_guard_check)
    s = gsub.add_parser("export", help="export the classifier to ONNX (dynamic batch; fp16 with guard.precision=fp16)")
    s.add_argument("out", help="the .onnx file to write")
    s.add_argument("overrides", nargs="*", help="guard.classifier=NAME, guard.precision=fp16|fp32")
    s.set_defaults(fn=cmd_guard_export)
    s = gsub.add_parser("build-engine", help="build (or reuse) the cached TensorRT engine for an ONNX classifier")
    s.add_argument("onnx", help="the ONNX file (from `vidgen guard export`)")
    s.add_argument("overrides", nargs="*", help="guard.precision, guard.batch_size (the profile's max batch), "
                                                "guard.engine_cache")
    s.set_defaults(fn=cmd_guard_build_engine)

    from .queue.cli import add_queue_parser

    add_queue_parser(sub)

    p = sub.add_parser("info", help="versions, devices, kernel and guard backends; or what a model is",
                       description="vidgen info [MODEL]: MODEL is a folder, a Hugging Face repo id in the local cache, "
                                   "or one weights file (variant, parameters, storage dtype per component, what is missing)")
    p.add_argument("model", nargs="?", help="a model folder, repo id or weights file")
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("models", help="the Wan models in the Hugging Face cache and in $VIDGEN_MODELS folders")
    p.add_argument("folders", nargs="*", help="more folders to look in (e.g. ~/ComfyUI/models)")
    p.set_defaults(fn=cmd_models)

    p = sub.add_parser("verify", help="check a file's signed C2PA manifest and watermark; print what generated it",
                       description="vidgen verify FILE [--trust CERT ...] [--json]: exit 0 valid and unchanged, 1 fails "
                                   "(one line says why), 2 the file cannot be read (docs/provenance.md)")
    p.add_argument("file", help="a video (.mp4, .mov, .gif; .mkv, .webm, .mxf with their NAME.c2pa sidecar)")
    p.add_argument("--trust", action="append", default=[], metavar="CERT",
                   help="a PEM file of CA certificates whose signers you accept (repeatable); without it the signer "
                        "is shown, not judged")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.set_defaults(fn=cmd_verify)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, options and KEY=VALUE overrides in any order (`vidgen render cfg -q seed=3`):
    argparse ends a positional list at the first option, so overrides after it come back as extras."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and not any(e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, handlers=[_LogLines(sys.stderr)])
    if not args.debug:
        command = (args.command, getattr(args, "config_command", None) or getattr(args, "queue_command", None))
        quiet_libraries(load=command not in LIGHT | VALIDATE_FIRST)
    try:
        code = args.fn(args)
        sys.stdout.flush()          # a reader that has gone (`| head`) shows here, not at the exit's flush
        return code
    except BrokenPipeError:
        return _reader_gone()
    except VidgenError as e:
        print(f"vidgen: error: {e}", file=sys.stderr)
        if args.debug:
            traceback.print_exc()
        return e.exit_code
    except KeyboardInterrupt:
        print("vidgen: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, or a package this environment lacks: one line unless asked for the traceback
        from .errors import environment_problem

        why = environment_problem(e)
        if args.debug:
            traceback.print_exc()
        elif why is not None:
            print(f"vidgen: error: this Python environment cannot run it: {why} (--debug shows where)", file=sys.stderr)
        else:
            print(f"vidgen: internal error: {type(e).__name__}: {e}".splitlines()[0] +
                  " (run with --debug for the traceback)", file=sys.stderr)
        return 1 if why is None else 2


def _reader_gone() -> int:
    """stdout's reader has left (`vidgen queue show 3 | head`): stop without a word, as `cat` does, with
    the shell's code for SIGPIPE."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())    # the flush at exit must not fail again
    except (OSError, ValueError):
        pass
    return 128 + 13


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
