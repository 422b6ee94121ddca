"""Where the frame classifier runs: a TensorRT engine, onnxruntime, or torch, chosen once.

`select_backend("auto", ...)` walks the ladder tensorrt -> onnxruntime -> torch, takes the first
that loads, and logs once which one and why each higher one was skipped. A named backend that
cannot run raises GuardrailUnavailable with the fix. The choice is cached per process for each
(model, device, preference, precision, batch), so a queue worker builds or loads once.

Every backend maps x [B, ...] to probabilities [B, 2] float32 on the CPU (column 1 = unsafe), and
raises GuardrailUnavailable when it fails or returns something that is not a probability pair: the
caller fails closed, it never reads an error as "safe".

Also here: the library side of the CLI's `guard export` and `guard build-engine` commands.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from collections.abc import MutableMapping
from typing import Callable, Protocol

import torch

from ..config import GUARD_BACKENDS
from ..errors import GuardrailUnavailable, VidgenError, install_hint
from .export import export_onnx, one_line as _one_line
from .tensorrt import EngineCache, TensorRTRunner, batch_profile, has_fp16_flag, import_tensorrt

log = logging.getLogger("vidgen")

PREFERENCES = GUARD_BACKENDS                  # "auto", then the ladder in order (guard.backend's values)
LADDER = PREFERENCES[1:]

_FIXES = {
    "tensorrt": f"install TensorRT (`{install_hint('tensorrt')}`, NVIDIA GPUs only) "
                "or set guard.backend to auto or onnxruntime",
    "onnxruntime": "`pip install onnxruntime` (onnxruntime-gpu for CUDA), check the ONNX file, "
                   "or set guard.backend to auto or torch",
    "torch": "check the classifier weights (guard.classifier) and the device, or set guard.backend to auto",
}


class Backend(Protocol):
    name: str
    detail: str

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class _Skip(Exception):
    """This backend cannot run here; the message says why (one line), and with `fixed` also how to fix it."""

    def __init__(self, why: str, fixed: bool = False):
        super().__init__(why)
        self.fixed = fixed


def _checked(name: str, run: Callable[[], torch.Tensor], batch: int) -> torch.Tensor:
    """Run a backend call; anything but a [batch, 2] probability tensor raises GuardrailUnavailable."""
    try:
        probs = run()
    except GuardrailUnavailable:
        raise
    except Exception as e:
        raise GuardrailUnavailable(f"the frame classifier ({name} backend) failed: {_one_line(e)}") from e
    return check_probs(name, probs, batch)


def check_probs(name: str, probs: torch.Tensor, batch: int) -> torch.Tensor:
    """`probs` as float32 on the CPU if it is a [batch, 2] tensor of probabilities; else GuardrailUnavailable."""
    probs = probs.detach().float().cpu()
    if tuple(probs.shape) != (batch, 2):
        raise GuardrailUnavailable(f"the frame classifier ({name} backend) returned shape {tuple(probs.shape)}, "
                                   f"expected ({batch}, 2)")
    if not bool(torch.isfinite(probs).all()) or bool((probs < -1e-3).any()) or bool((probs > 1 + 1e-3).any()):
        raise GuardrailUnavailable(f"the frame classifier ({name} backend) returned values that are not probabilities")
    return probs


class TensorRTBackend:
    name = "tensorrt"

    def __init__(self, runner: Callable[[torch.Tensor], torch.Tensor], engine_path: Path, built: bool):
        self.runner, self.engine_path = runner, Path(engine_path)
        self.detail = f"engine {self.engine_path.name[:16]}..., {'built now' if built else 'cached'}"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, ...] -> [B, 2] float32 on the CPU."""
        return _checked(self.name, lambda: self.runner(x), x.shape[0])


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def __init__(self, onnx_path: str | os.PathLike, *, use_cuda: bool):
        import onnxruntime as ort

        providers = ["CPUExecutionProvider"]
        if use_cuda and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        self.session = ort.InferenceSession(str(onnx_path), providers=providers)
        meta = self.session.get_inputs()[0]
        self.input_name = meta.name
        self.input_dtype = torch.float16 if meta.type == "tensor(float16)" else torch.float32
        self.provider = self.session.get_providers()[0]
        self.detail = f"{Path(onnx_path).name} on {self.provider}"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, ...] -> [B, 2] float32 on the CPU."""
        def run():
            feed = {self.input_name: x.detach().to("cpu", self.input_dtype).contiguous().numpy()}
            return torch.from_numpy(self.session.run(None, feed)[0])
        return _checked(self.name, run, x.shape[0])


class TorchBackend:
    name = "torch"

    def __init__(self, module: torch.nn.Module, device: torch.device):
        self.device = device
        self.module = module.to(device=device, dtype=torch.float32).eval()
        self.detail = f"{type(module).__name__} on {device}"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, ...] -> [B, 2] float32 on the CPU."""
        def run():
            with torch.inference_mode():
                return self.module(x.to(self.device, torch.float32))
        return _checked(self.name, run, x.shape[0])


_CHOOSING = threading.Lock()


def select_backend(preference: str, module_factory: Callable[[], torch.nn.Module] | None,
                   onnx_path_or_export_fn: str | os.PathLike | Callable[[bool], Path] | None,
                   device: str | torch.device, *, cache: EngineCache | None = None,
                   cache_root: str | os.PathLike | None = None, trt=None, precision: str = "fp16",
                   max_batch: int = 32, model: str | None = None, cuda_available: bool | None = None,
                   runner_factory: Callable[[bytes, object], Callable] | None = None,
                   chosen: MutableMapping | None = None) -> Backend:
    """The classifier backend: the first of the ladder that runs, reused from `chosen` if it holds one.

    Args:
        preference: "auto" (first of tensorrt, onnxruntime, torch that runs) or one of those.
        module_factory: builds the torch classifier; called only if the torch backend is tried.
            None: no torch module (an .onnx classifier), so no torch backend.
        onnx_path_or_export_fn: the ONNX file, or `fn(fp16: bool) -> Path` exporting one on demand
            (fp16=True only for TensorRT 11 fp16 engines, which need an fp16 graph); None: no graph,
            so only the torch backend.
        device: "cuda", "cuda:N", "mps", "cpu", or "auto" (cuda, then mps, then cpu).
        cache: where engines live (default EngineCache(cache_root)); cache_root: that folder
            (None: $VIDGEN_CACHE/engines or ~/.cache/vidgen/engines); trt: the tensorrt module.
        precision: TensorRT engine precision, "fp16" or "fp32".
        max_batch: the largest batch that will be passed (the engine's batch profile).
        model: the name the choice is cached under (default: the ONNX path or export fn's name).
        cuda_available: override torch.cuda.is_available() (tests); runner_factory: builds the
            engine runner from (engine bytes, trt) (default TensorRTRunner; tests).
        chosen: where the chosen backend is kept under its settings (a Pipeline's memo.Memo), so
            the renders of one pipeline load it once; None = choose and load it now.
    Raises:
        GuardrailUnavailable: the named backend cannot run, or (auto) none can.
    """
    if preference not in PREFERENCES:
        raise GuardrailUnavailable(f"unknown guard backend {preference!r}; use one of {', '.join(PREFERENCES)}")
    cuda_available = torch.cuda.is_available() if cuda_available is None else cuda_available
    device = _resolve_device(device, cuda_available)
    source = onnx_path_or_export_fn if onnx_path_or_export_fn is not None else module_factory
    model = model or _source_name(source)
    engine_root = str(cache.root if cache is not None else cache_root or "")
    key = (model, str(device), preference, precision, max_batch, engine_root)
    chosen = {} if chosen is None else chosen
    with _CHOOSING:
        if key in chosen:
            return chosen[key]
        onnx = _OnnxSource(onnx_path_or_export_fn)
        engines = cache or EngineCache(cache_root)
        makers = {"tensorrt": lambda: _make_tensorrt(onnx, device, cuda_available, engines, trt, precision,
                                                     max_batch, runner_factory),
                  "onnxruntime": lambda: _make_onnxruntime(onnx, device),
                  "torch": lambda: _make_torch(module_factory, device)}
        skipped: list[str] = []
        for name in (LADDER if preference == "auto" else (preference,)):
            try:
                backend = makers[name]()
            except _Skip as why:
                if preference != "auto":
                    fix = "" if why.fixed else f"; {_FIXES[name]}"
                    raise GuardrailUnavailable(f"guard backend {name} cannot run: {why}{fix}") from (why.__cause__ or why)
                skipped.append(f"{name}: {why}")
                continue
            because = f"; skipped {'; '.join(skipped)}" if skipped else ""
            log.info("guard classifier %s: %s backend (%s)%s", model, name, backend.detail, because)
            chosen[key] = backend
            return backend
        raise GuardrailUnavailable("no frame classifier backend can run (" + "; ".join(skipped) +
                                   "); the guard fails closed: fix one of them or turn off guard.frames")


def _source_name(source) -> str:
    if source is None:
        return "none"
    if isinstance(source, (str, os.PathLike)):
        return str(Path(source).resolve())
    name = f"{getattr(source, '__module__', '')}.{getattr(source, '__qualname__', type(source).__name__)}"
    # Two lambdas or closures share a qualname but may export different models: never share a choice.
    return f"{name}@{id(source):x}" if "<" in name else name


def _resolve_device(device: str | torch.device, cuda_available: bool) -> torch.device:
    if str(device) == "auto":
        if cuda_available:
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        return torch.device("mps" if mps is not None and mps.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        # one name per GPU: "cuda" (preflight) and "cuda:0" (the VAE's parameters) share a backend
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class _OnnxSource:
    """The ONNX file for each graph precision, exported at most once per precision."""

    def __init__(self, source):
        self.source, self._paths = source, {}

    def get(self, fp16: bool) -> Path:
        if self.source is None:
            raise _Skip("this classifier has no ONNX graph (register_classifier(..., onnx_source=...))")
        if isinstance(self.source, (str, os.PathLike)):
            path = Path(self.source)
            if not path.is_file():
                raise _Skip(f"no ONNX model at {path}")
            return path
        if fp16 not in self._paths:
            try:
                self._paths[fp16] = Path(self.source(fp16))
            except VidgenError as e:    # says itself what is missing (weights package, onnxscript) and the fix
                raise _Skip(_one_line(e), fixed=True) from e
            except Exception as e:
                raise _Skip(f"ONNX export failed: {_one_line(e)}") from e
        return self._paths[fp16]


def _make_tensorrt(onnx: _OnnxSource, device: torch.device, cuda_available: bool, cache, trt, precision: str,
                   max_batch: int, runner_factory) -> TensorRTBackend:
    if trt is None:
        try:
            trt = import_tensorrt()
        except GuardrailUnavailable as e:
            raise _Skip(f"tensorrt is not importable ({_one_line(e.__cause__ or e)})") from e
    if device.type != "cuda":
        raise _Skip(f"the classifier device is {device}, and TensorRT runs on CUDA only")
    if not cuda_available:
        raise _Skip("no CUDA device is visible")
    # TensorRT 11 builds fp16 only from an fp16 graph; 10.x gets the fp32 graph and its FP16 flag.
    path = onnx.get(fp16=precision == "fp16" and not has_fp16_flag(trt))
    try:
        engine, engine_path, built = cache.get_or_build(path, precision, batch_profile(max_batch), trt=trt)
    except Exception as e:
        raise _Skip(f"engine build failed: {_one_line(e)}") from e
    try:
        runner = (runner_factory or TensorRTRunner)(engine, trt)
    except Exception as e:
        raise _Skip(f"engine would not load: {_one_line(e)}") from e
    return TensorRTBackend(runner, engine_path, built)


def _make_onnxruntime(onnx: _OnnxSource, device: torch.device) -> OnnxRuntimeBackend:
    try:
        import onnxruntime  # noqa: F401
    except Exception as e:
        raise _Skip(f"onnxruntime is not importable ({_one_line(e)})") from e
    path = onnx.get(fp16=False)
    try:
        return OnnxRuntimeBackend(path, use_cuda=device.type == "cuda")
    except Exception as e:
        raise _Skip(f"could not load {path.name}: {_one_line(e)}") from e


def _make_torch(module_factory: Callable[[], torch.nn.Module] | None, device: torch.device) -> TorchBackend:
    if module_factory is None:
        raise _Skip("an .onnx classifier has no torch module")
    try:
        return TorchBackend(module_factory(), device)
    except Exception as e:
        raise _Skip(f"the classifier did not load on {device}: {_one_line(e)}") from e


def export_command(classifier_module: torch.nn.Module, out_path: str | os.PathLike, fp16: bool, *,
                   max_batch: int = 32, input_shape: tuple[int, ...] | None = None) -> Path:
    """`vidgen guard export`: write the classifier as a checked ONNX file; returns its path.

    input_shape: one sample's shape; default the module's `input_shape` attribute, else (3, 224, 224).
    """
    shape = tuple(input_shape or getattr(classifier_module, "input_shape", (3, 224, 224)))
    example = torch.randn((2, *shape), generator=torch.Generator().manual_seed(0))
    return export_onnx(classifier_module, out_path, example=example, max_batch=max_batch, fp16=fp16)


def build_engine_command(onnx_path: str | os.PathLike, precision: str, max_batch: int,
                         cache_root: str | os.PathLike | None, *, trt=None,
                         gpu: tuple[str, tuple[int, int]] | None = None) -> Path:
    """`vidgen guard build-engine`: build (or find) the engine a render with guard.batch_size =
    max_batch will use, on this machine's GPU; returns the engine's path.

    Raises GuardrailUnavailable (one line, with the fix) without TensorRT or a CUDA GPU.
    """
    trt = import_tensorrt() if trt is None else trt
    if gpu is None and not torch.cuda.is_available():
        raise GuardrailUnavailable("building a TensorRT engine needs a CUDA GPU and none is visible; "
                                   "run this on the machine that will render")
    cache = EngineCache(cache_root, gpu=gpu)
    _, path, built = cache.get_or_build(onnx_path, precision, batch_profile(max_batch), trt=trt)
    log.info("TensorRT engine %s: %s", "built" if built else "already cached", path)
    return path
