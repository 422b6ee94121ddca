"""TensorRT engines for the frame classifier: build, cache on disk, run on CUDA tensors.

TensorRT is imported only inside functions (it is an optional extra and needs a CUDA GPU), and
every function takes the module as `trt`, so tests drive the same code with a stand-in.

Engines are only valid for the TensorRT version and GPU that built them, so the cache key is a
sha256 of (ONNX bytes, TensorRT version, GPU name, compute capability, precision, batch profile).
A build takes seconds to minutes; two processes wanting the same key serialise on a file lock, and
the second reuses the first one's engine. Each engine has a JSON sidecar (its key inputs, size and
sha256): an engine whose bytes do not match it, or that TensorRT will not deserialize, is rebuilt.

Precision: TensorRT 10 builds fp16 from an fp32 graph with BuilderFlag.FP16 (weak typing), or from
an fp16 graph as a strongly typed network. TensorRT 11 removed the precision flags; every network
is strongly typed, so fp16 needs an fp16 ONNX graph (`export_onnx(..., fp16=True)`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from pathlib import Path

import torch

from ..config import GUARD_PRECISIONS as PRECISIONS
from ..errors import GuardrailUnavailable, install_hint
from ..io import atomic_write_bytes, write_sidecar
from .export import onnx_input_is_fp16

log = logging.getLogger("vidgen")

_SIDECAR_FORMAT = 1
_INSTALL_HINT = (f"install it with `{install_hint('tensorrt')}` on a Linux/Windows machine with an NVIDIA GPU, "
                 "or set guard.backend to auto or onnxruntime")


def import_tensorrt():
    """The tensorrt module; raises GuardrailUnavailable with the fix when it is missing or broken."""
    try:
        import tensorrt
    except Exception as e:     # ImportError, or a wheel whose native libraries fail to load
        raise GuardrailUnavailable(f"TensorRT is not available ({type(e).__name__}: {e}); {_INSTALL_HINT}") from e
    return tensorrt


def trt_major(trt) -> int:
    return int(str(trt.__version__).split(".")[0])


def has_fp16_flag(trt) -> bool:
    """Whether this TensorRT still has the weak-typing FP16 builder flag (10.x yes, 11.x removed it)."""
    return trt_major(trt) < 11 and hasattr(trt.BuilderFlag, "FP16")


def batch_profile(max_batch: int) -> tuple[int, int, int]:
    """The (min, opt, max) batch profile for a guard batch size; one rule, so `vidgen guard
    build-engine` and the render find the same cached engine."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    return (1, max_batch, max_batch)


def engine_key(onnx_bytes: bytes, trt_version: str, gpu_name: str, compute_capability, precision: str,
               profile: tuple[int, int, int]) -> str:
    """sha256 hex naming one engine: it changes with every input that makes an engine unusable."""
    return _digest(_key_inputs(onnx_bytes, trt_version, gpu_name, compute_capability, precision, profile))


def _digest(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _key_inputs(onnx_bytes, trt_version, gpu_name, compute_capability, precision, profile) -> dict:
    if isinstance(compute_capability, (tuple, list)):
        compute_capability = ".".join(str(int(v)) for v in compute_capability)
    return {"onnx_sha256": hashlib.sha256(onnx_bytes).hexdigest(), "onnx_size": len(onnx_bytes),
            "trt_version": str(trt_version), "gpu_name": str(gpu_name),
            "compute_capability": str(compute_capability), "precision": precision,
            "profile": [int(v) for v in profile]}


def cuda_gpu(index: int | None = None) -> tuple[str, tuple[int, int]]:
    """(name, compute capability) of a CUDA device, the current one by default."""
    index = torch.cuda.current_device() if index is None else index
    return torch.cuda.get_device_name(index), tuple(torch.cuda.get_device_capability(index))


def default_cache_root() -> Path:
    if env := os.environ.get("VIDGEN_CACHE"):
        return Path(env) / "engines"
    return Path.home() / ".cache" / "vidgen" / "engines"


class EngineCache:
    """A folder of built engines, `<key>.engine` + `<key>.engine.json`, safe across processes.

    Args:
        root: the folder; None = $VIDGEN_CACHE/engines, else ~/.cache/vidgen/engines.
        gpu: (name, (major, minor)) of the GPU engines are built for; None = the current CUDA device.
    """

    def __init__(self, root: str | os.PathLike | None = None, *, gpu: tuple[str, tuple[int, int]] | None = None):
        self.root = Path(root) if root else default_cache_root()
        self._gpu = gpu

    def get_or_build(self, onnx_path: str | os.PathLike, precision: str, profile: tuple[int, int, int], *,
                     trt=None) -> tuple[bytes, Path, bool]:
        """The engine for this ONNX file, precision and batch profile: reused when a valid one is
        cached, else built (under the key's file lock) and stored.

        Returns:
            (engine bytes, engine path, whether this call built it).
        Raises:
            GuardrailUnavailable: TensorRT is missing, the ONNX file is unreadable, or the build failed.
        """
        trt = import_tensorrt() if trt is None else trt
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if not 1 <= profile[0] <= profile[1] <= profile[2]:
            raise ValueError(f"profile must be (min, opt, max) with 1 <= min <= opt <= max, got {profile}")
        try:
            onnx_bytes = Path(onnx_path).read_bytes()
        except OSError as e:
            raise GuardrailUnavailable(f"cannot read the ONNX model {onnx_path}: {e.strerror or e}") from e
        gpu_name, capability = self._gpu or cuda_gpu()
        inputs = _key_inputs(onnx_bytes, trt.__version__, gpu_name, capability, precision, profile)
        key = _digest(inputs)
        path = self.root / f"{key}.engine"
        logger = make_logger(trt)
        self.root.mkdir(parents=True, exist_ok=True)
        with _file_lock(self.root / f"{key}.lock", what=f"engine {key[:12]}"):
            cached, reason = _load_valid(trt, logger, path, key, inputs)
            if cached is not None:
                log.debug("TensorRT engine %s reused", path)
                return cached, path, False
            if reason != "missing":
                log.warning("TensorRT engine %s is %s; rebuilding it", path.name, reason)
            log.info("building a TensorRT %s engine for %s (batch %d..%d); this can take minutes",
                     precision, Path(onnx_path).name, profile[0], profile[2])
            engine = build_engine(trt, onnx_bytes, precision, tuple(profile), logger)
            _store(path, key, inputs, engine)
        return engine, path, True


def _load_valid(trt, logger, path: Path, key: str, inputs: dict) -> tuple[bytes | None, str]:
    """(engine bytes, "ok") when the cached engine is whole and matches its sidecar, else (None, why)."""
    if not path.exists():
        return None, "missing"
    data = path.read_bytes()
    if not data:
        return None, "empty"
    try:
        meta = json.loads(Path(f"{path}.json").read_text())
    except (OSError, ValueError):
        return None, "without a readable sidecar"
    if not isinstance(meta, dict):
        return None, "without a readable sidecar"
    want = {"format": _SIDECAR_FORMAT, "key": key, **inputs}
    if any(meta.get(k) != v for k, v in want.items()):
        return None, "described by a sidecar for other inputs"
    if meta.get("engine_size") != len(data):
        return None, f"truncated or padded ({len(data)} bytes, its sidecar says {meta.get('engine_size')})"
    if meta.get("engine_sha256") != hashlib.sha256(data).hexdigest():
        return None, "corrupt (sha256 differs from its sidecar)"
    try:
        engine = trt.Runtime(logger).deserialize_cuda_engine(data)
    except Exception as e:
        return None, f"not deserializable ({type(e).__name__}: {e})"
    if engine is None:
        return None, "not deserializable"
    return data, "ok"


def _store(path: Path, key: str, inputs: dict, engine: bytes) -> None:
    # Engine first: a crash between the two writes leaves an engine without a sidecar, which the
    # next run rebuilds, never a sidecar vouching for a missing engine.
    atomic_write_bytes(path, engine)
    write_sidecar(path, {"format": _SIDECAR_FORMAT, "key": key, **inputs, "engine_size": len(engine),
                         "engine_sha256": hashlib.sha256(engine).hexdigest()})


@contextlib.contextmanager
def _file_lock(lock_path: Path, *, what: str):
    """Exclusive flock on `lock_path`: across processes, and across threads (each open() is its own
    open file description, which is what flock locks)."""
    import fcntl   # POSIX only; TensorRT's Windows builds would need msvcrt.locking here

    with open(lock_path, "a+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process building %s", what)
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def make_logger(trt):
    """A TensorRT logger that forwards to the `vidgen` logger (errors, warnings; info as debug)."""
    base = getattr(trt, "ILogger", None)
    if base is None:
        return trt.Logger(trt.Logger.WARNING)
    levels = {"INTERNAL_ERROR": logging.ERROR, "ERROR": logging.ERROR, "WARNING": logging.WARNING,
              "INFO": logging.DEBUG}

    class _Logger(base):
        def __init__(self):
            base.__init__(self)   # pybind11 trampolines need the base initialised explicitly

        def log(self, severity, msg):
            level = levels.get(getattr(severity, "name", str(severity).rsplit(".", 1)[-1]))
            if level is not None:
                log.log(level, "TensorRT: %s", msg)

    return _Logger()


def build_engine(trt, onnx_bytes: bytes, precision: str, profile: tuple[int, int, int], logger) -> bytes:
    """Parse `onnx_bytes` and build a serialized engine whose input batch spans `profile`.

    Raises GuardrailUnavailable with one line: parser errors, a precision this TensorRT cannot
    build from this graph, or a failed build.
    """
    graph_fp16 = onnx_input_is_fp16(onnx_bytes)
    if precision == "fp32" and graph_fp16:
        raise GuardrailUnavailable("precision fp32 was asked for but the ONNX graph is fp16; "
                                   "export it with guard.precision=fp32, or use precision fp16")
    use_flag = precision == "fp16" and not graph_fp16
    if use_flag and not has_fp16_flag(trt):
        raise GuardrailUnavailable(
            f"TensorRT {trt.__version__} has no FP16 builder flag: an fp16 engine needs an fp16 ONNX graph; "
            "export one with `vidgen guard export OUT guard.precision=fp16`, or use precision fp32")
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags(trt, strongly_typed=graph_fp16))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errors = [" ".join(str(parser.get_error(i)).split()) for i in range(parser.num_errors)]
        first = errors[0] if errors else "unknown error"
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise GuardrailUnavailable(f"TensorRT could not parse the ONNX model: {first}{more}")
    if network.num_inputs != 1:
        raise GuardrailUnavailable(f"the classifier graph has {network.num_inputs} inputs; "
                                   "vidgen expects one image batch")
    tensor = network.get_input(0)
    shape = tuple(tensor.shape)   # [-1, C, H, W]: only the batch is dynamic
    if any(d < 0 for d in shape[1:]):
        raise GuardrailUnavailable(f"the classifier input {tensor.name} has dynamic dimensions besides the batch: "
                                   f"{shape}")
    config = builder.create_builder_config()
    if use_flag:
        config.set_flag(trt.BuilderFlag.FP16)
    opt_profile = builder.create_optimization_profile()
    opt_profile.set_shape(tensor.name, *[(b, *shape[1:]) for b in profile])
    config.add_optimization_profile(opt_profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise GuardrailUnavailable(f"TensorRT {trt.__version__} failed to build the {precision} engine "
                                   "(its log above says why); set guard.backend to onnxruntime meanwhile")
    return bytes(serialized)


def _network_flags(trt, *, strongly_typed: bool) -> int:
    flags = trt.NetworkDefinitionCreationFlag
    major = trt_major(trt)
    if major < 10 and hasattr(flags, "EXPLICIT_BATCH"):
        return 1 << int(flags.EXPLICIT_BATCH)   # 8.x/9.x: implicit batch unless asked; 10+: always explicit
    if strongly_typed and major == 10 and hasattr(flags, "STRONGLY_TYPED"):
        # An fp16 graph on 10.x: keep the graph's types. 11.x is always strongly typed and only
        # keeps this flag as a deprecated no-op, so it is not passed there.
        return 1 << int(flags.STRONGLY_TYPED)
    return 0


_TORCH_DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT32": torch.int32}


def _torch_dtype(trt, dtype) -> torch.dtype:
    for name, torch_dtype in _TORCH_DTYPES.items():
        if hasattr(trt.DataType, name) and dtype == getattr(trt.DataType, name):
            return torch_dtype
    raise GuardrailUnavailable(f"the TensorRT engine uses tensor type {dtype}, which vidgen cannot feed")


class TensorRTRunner:
    """Runs a serialized engine on batches of torch tensors: [B, ...] -> [B, 2] float32.

    Args:
        engine_bytes: a serialized engine with one input and one output.
        trt: the tensorrt module (None = import it).
        device: where buffers live; None = the current CUDA device. "cpu" only makes sense with a
            stand-in `trt` (tests), since real engines read device memory.
    """

    def __init__(self, engine_bytes: bytes, trt=None, *, device: str | torch.device | None = None):
        self.trt = import_tensorrt() if trt is None else trt
        self._logger = make_logger(self.trt)   # TensorRT keeps a pointer: it must outlive the engine
        self._runtime = self.trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise GuardrailUnavailable("TensorRT could not deserialize the engine (built by another version or GPU?); "
                                       "delete it from the engine cache to rebuild")
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise GuardrailUnavailable("TensorRT could not create an execution context (out of GPU memory?)")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        inputs = [n for n in names if self.engine.get_tensor_mode(n) == self.trt.TensorIOMode.INPUT]
        outputs = [n for n in names if n not in inputs]
        if len(inputs) != 1 or len(outputs) != 1:
            raise GuardrailUnavailable(f"the TensorRT engine has inputs {inputs} and outputs {outputs}; "
                                       "vidgen expects one of each")
        self.input_name, self.output_name = inputs[0], outputs[0]
        self.input_dtype = _torch_dtype(self.trt, self.engine.get_tensor_dtype(self.input_name))
        self.output_dtype = _torch_dtype(self.trt, self.engine.get_tensor_dtype(self.output_name))
        # profile 0's (min, opt, max) shapes; larger batches run in chunks of max
        try:
            self.max_batch = int(self.engine.get_tensor_profile_shape(self.input_name, 0)[2][0])
        except Exception:   # no profile query in this TensorRT: one call per batch, set_input_shape checks it
            self.max_batch = None
        self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        self._lock = threading.Lock()   # one execution context: one batch at a time

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, ...] -> probabilities [B, 2] float32 on self.device."""
        with self._lock:
            chunks = x.split(self.max_batch) if self.max_batch else (x,)
            return torch.cat([self._run(chunk) for chunk in chunks])

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(device=self.device, dtype=self.input_dtype).contiguous()
        if not self.context.set_input_shape(self.input_name, tuple(x.shape)):
            raise GuardrailUnavailable(f"TensorRT rejected input shape {tuple(x.shape)} for {self.input_name}")
        out = torch.empty(tuple(self.context.get_tensor_shape(self.output_name)), dtype=self.output_dtype,
                          device=self.device)
        self.context.set_tensor_address(self.input_name, x.data_ptr())
        self.context.set_tensor_address(self.output_name, out.data_ptr())
        # The current torch stream, so the work is ordered after whatever produced `x`.
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        if not self.context.execute_async_v3(stream):
            raise GuardrailUnavailable("TensorRT execution failed (its log says why)")
        return out.float()
