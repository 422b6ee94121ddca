"""Guard classifier backends: ONNX export parity, the TensorRT engine cache, the backend ladder.

TensorRT is not installable on CPU machines, so most tests drive vidgen.guard.tensorrt with a
stand-in `tensorrt` module (FakeTensorRT below) that records calls and whose "engines" run the
ONNX graph with onnxruntime, reading and writing the buffers at the addresses the runner passes,
as a real engine reads device memory. One test builds a real engine where tensorrt imports.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import json
import logging
import multiprocessing
import sys
import threading
import time
import types

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from vidgen.errors import GuardrailUnavailable
from vidgen.guard.backends import build_engine_command, export_command, select_backend
from vidgen.guard.export import export_onnx, onnx_input_is_fp16
from vidgen.guard.tensorrt import EngineCache, TensorRTRunner, batch_profile, engine_key

SHAPE = (3, 32, 32)      # one sample; the contract's [3, 224, 224] is only slower
GPU = ("NVIDIA Fake H100", (9, 0))
PROFILE = (1, 4, 4)


class TinyClassifier(torch.nn.Module):
    """Same contract as the frame classifier: [B, 3, H, W] -> softmax [B, 2]."""

    input_shape = SHAPE

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2)
        self.fc = torch.nn.Linear(8, 2)

    def forward(self, x):
        y = torch.relu(self.conv(x)).mean(dim=(2, 3))   # [B, 8]
        return torch.softmax(self.fc(y), dim=1)


def tiny() -> TinyClassifier:
    torch.manual_seed(0)
    return TinyClassifier().eval()


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory):
    """(fp32 path, fp16 path) of the tiny classifier, exported once: export is the slow part."""
    root = tmp_path_factory.mktemp("onnx")
    fp32 = export_command(tiny(), root / "tiny.onnx", fp16=False, max_batch=8)
    fp16 = export_onnx(tiny(), root / "tiny_fp16.onnx", example=torch.randn(2, *SHAPE), max_batch=8, fp16=True)
    return fp32, fp16


# --- a stand-in tensorrt module ---------------------------------------------------------------

MAGIC = b"FAKE-TRT-ENGINE\n"


class FakeTensorRT(types.ModuleType):
    """The slice of TensorRT's Python API vidgen uses, recording each call in `calls`.

    version "10.x" has BuilderFlag.FP16 and the STRONGLY_TYPED network flag; "11.x" has neither
    flag (strong typing always on), as in TensorRT 11.
    """

    def __init__(self, version: str = "10.9.0", *, build_delay: float = 0.0, counter=None, parse_errors=()):
        super().__init__("tensorrt")
        self.__version__ = version
        self.calls: list[tuple] = []
        self.builds = 0
        major = int(version.split(".")[0])
        fake = self
        self.BuilderFlag = enum.IntEnum("BuilderFlag", ["FP16", "TF32"] if major < 11 else ["TF32"], start=0)
        network_flags = ["EXPLICIT_BATCH", "STRONGLY_TYPED"] if major < 11 else ["STRONGLY_TYPED"]
        self.NetworkDefinitionCreationFlag = enum.IntEnum("NetworkDefinitionCreationFlag", network_flags, start=0)
        self.DataType = enum.Enum("DataType", ["FLOAT", "HALF"])
        self.TensorIOMode = enum.Enum("TensorIOMode", ["INPUT", "OUTPUT"])

        class ILogger:
            def __init__(self):
                pass

        class Logger(ILogger):
            WARNING = "WARNING"

            def __init__(self, severity=None):
                pass

        class Network:
            def __init__(self, flags):
                self.flags, self.inputs = flags, []

            @property
            def num_inputs(self):
                return len(self.inputs)

            def get_input(self, i):
                return self.inputs[i]

        class Parser:
            def __init__(self, network, logger):
                self.network, self.errors = network, list(parse_errors)

            @property
            def num_errors(self):
                return len(self.errors)

            def get_error(self, i):
                return self.errors[i]

            def parse(self, data):
                fake.calls.append(("parse", len(data)))
                if self.errors:
                    return False
                model = onnx.load_from_string(data)
                for value in model.graph.input:
                    kind = value.type.tensor_type
                    shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in kind.shape.dim)
                    dtype = fake.DataType.HALF if kind.elem_type == onnx.TensorProto.FLOAT16 else fake.DataType.FLOAT
                    self.network.inputs.append(types.SimpleNamespace(name=value.name, shape=shape, dtype=dtype))
                self.network.onnx = data
                return True

        class Config:
            def __init__(self):
                self.flags, self.profiles = [], []

            def set_flag(self, flag):
                fake.calls.append(("set_flag", flag.name))
                self.flags.append(flag)

            def add_optimization_profile(self, profile):
                self.profiles.append(profile)

        class Profile:
            def set_shape(self, name, min, opt, max):
                fake.calls.append(("set_shape", name, tuple(min), tuple(opt), tuple(max)))
                self.shapes = {name: (tuple(min), tuple(opt), tuple(max))}

        class Builder:
            def __init__(self, logger):
                pass

            def create_network(self, flags=0):
                fake.calls.append(("create_network", flags))
                return Network(flags)

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                time.sleep(build_delay)
                fake.builds += 1
                if counter is not None:
                    with open(counter, "a") as f:
                        f.write("build\n")
                fake.calls.append(("build", network.flags, tuple(f.name for f in config.flags)))
                (name, shapes), = config.profiles[0].shapes.items()
                half = network.inputs[0].dtype == fake.DataType.HALF
                header = json.dumps({"input": name, "shapes": shapes, "half": half}).encode()
                return MAGIC + header + b"\n" + network.onnx

        class Runtime:
            def __init__(self, logger):
                pass

            def deserialize_cuda_engine(self, data):
                fake.calls.append(("deserialize", len(data)))
                if not bytes(data).startswith(MAGIC):
                    return None
                header, model = bytes(data)[len(MAGIC):].split(b"\n", 1)
                return Engine(json.loads(header), model)   # a broken model raises, as TensorRT may

        class Engine:
            def __init__(self, header, model):
                self.session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
                self.names = [header["input"], self.session.get_outputs()[0].name]
                self.shapes, self.half = header["shapes"], header["half"]
                self.num_io_tensors = 2

            def get_tensor_name(self, i):
                return self.names[i]

            def get_tensor_mode(self, name):
                return fake.TensorIOMode.INPUT if name == self.names[0] else fake.TensorIOMode.OUTPUT

            def get_tensor_dtype(self, name):
                return fake.DataType.HALF if self.half else fake.DataType.FLOAT

            def get_tensor_profile_shape(self, name, profile_index):
                return self.shapes

            def create_execution_context(self):
                return Context(self)

        class Context:
            def __init__(self, engine):
                self.engine, self.shape, self.addresses = engine, None, {}

            def set_input_shape(self, name, shape):
                lo, _, hi = self.engine.shapes
                ok = len(shape) == len(lo) and all(a <= s <= b for a, s, b in zip(lo, shape, hi))
                fake.calls.append(("set_input_shape", name, tuple(shape), ok))
                self.shape = tuple(shape) if ok else None
                return ok

            def get_tensor_shape(self, name):
                return (self.shape[0], 2)

            def set_tensor_address(self, name, address):
                self.addresses[name] = address

            def execute_async_v3(self, stream_handle):
                fake.calls.append(("execute_async_v3", stream_handle))
                dtype = np.float16 if self.engine.half else np.float32
                inp, out = self.engine.names
                x = _view(self.addresses[inp], self.shape, dtype).copy()
                y = self.engine.session.run(None, {inp: x})[0]
                _view(self.addresses[out], (self.shape[0], 2), dtype)[...] = y
                return True

        self.ILogger, self.Logger, self.Builder, self.Runtime = ILogger, Logger, Builder, Runtime
        self.OnnxParser = Parser


def _view(address: int, shape, dtype) -> np.ndarray:
    """Host memory at `address` as an array (the stand-in's engines run on CPU tensors)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(address)).view(dtype).reshape(shape)


def cpu_runner(engine_bytes, trt):
    return TensorRTRunner(engine_bytes, trt, device="cpu")


def reference(x):
    with torch.no_grad():
        return tiny()(x)


# --- export -----------------------------------------------------------------------------------

def test_export_matches_torch_at_batch_1_and_3(onnx_files, tmp_path):
    fp32, fp16 = onnx_files
    model = onnx.load(fp32)
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].HasField("dim_param")   # dynamic batch
    assert not onnx_input_is_fp16(fp32.read_bytes()) and onnx_input_is_fp16(fp16.read_bytes())
    assert not list(fp32.parent.glob(".*partial*"))   # the temporary file was renamed away
    for path, dtype, atol in ((fp32, np.float32, 1e-5), (fp16, np.float16, 2e-2)):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for batch in (1, 3):
            x = torch.randn(batch, *SHAPE)
            got = session.run(None, {"images": x.numpy().astype(dtype)})[0]
            assert got.shape == (batch, 2)
            np.testing.assert_allclose(got.astype(np.float32), reference(x).numpy(), atol=atol)


def test_failed_export_leaves_no_file(tmp_path):
    class Broken(TinyClassifier):
        def forward(self, x):
            raise RuntimeError("no forward")

    with pytest.raises(GuardrailUnavailable, match="export of Broken failed"):
        export_onnx(Broken(), tmp_path / "broken.onnx", example=torch.randn(2, *SHAPE))
    assert list(tmp_path.iterdir()) == []


# --- engine cache -----------------------------------------------------------------------------

def test_engine_key_changes_with_each_input():
    base = dict(onnx_bytes=b"graph", trt_version="10.9.0", gpu_name="H100", compute_capability=(9, 0),
                precision="fp16", profile=(1, 8, 8))
    changes = dict(onnx_bytes=b"graph2", trt_version="11.0.0", gpu_name="A100", compute_capability=(8, 0),
                   precision="fp32", profile=(1, 8, 16))
    key = engine_key(**base)
    assert len(key) == 64 and int(key, 16) >= 0
    assert engine_key(**base) == key and engine_key(**{**base, "compute_capability": "9.0"}) == key
    for name, value in changes.items():
        assert engine_key(**{**base, name: value}) != key, name


def test_second_get_or_build_reuses_the_engine(onnx_files, tmp_path):
    trt = FakeTensorRT()
    cache = EngineCache(tmp_path, gpu=GPU)
    engine, path, built = cache.get_or_build(onnx_files[0], "fp32", PROFILE, trt=trt)
    assert built and path.read_bytes() == engine and trt.builds == 1
    meta = json.loads(path.with_name(path.name + ".json").read_text())
    assert meta["engine_sha256"] == hashlib.sha256(engine).hexdigest() and meta["profile"] == list(PROFILE)
    assert meta["gpu_name"] == GPU[0] and meta["compute_capability"] == "9.0" and meta["trt_version"] == "10.9.0"
    again, path2, built2 = EngineCache(tmp_path, gpu=GPU).get_or_build(onnx_files[0], "fp32", PROFILE, trt=trt)
    assert (again, path2, built2) == (engine, path, False) and trt.builds == 1
    # another GPU or precision is another engine
    EngineCache(tmp_path, gpu=("NVIDIA Fake L4", (8, 9))).get_or_build(onnx_files[0], "fp32", PROFILE, trt=trt)
    assert trt.builds == 2


@pytest.mark.parametrize("damage", ["truncate", "empty", "garbage_with_matching_sidecar",
                                    "undeserializable_with_matching_sidecar", "sidecar_other_inputs", "no_sidecar"])
def test_damaged_engine_is_rebuilt(onnx_files, tmp_path, damage, caplog):
    trt = FakeTensorRT()
    cache = EngineCache(tmp_path, gpu=GPU)
    engine, path, _ = cache.get_or_build(onnx_files[0], "fp32", PROFILE, trt=trt)
    sidecar = path.with_name(path.name + ".json")
    meta = json.loads(sidecar.read_text())

    def replace_engine(data):   # and make the sidecar vouch for it, so only deserialize can tell
        path.write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        sidecar.write_text(json.dumps({**meta, "engine_size": len(data), "engine_sha256": sha}))

    if damage == "truncate":
        path.write_bytes(engine[: len(engine) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "garbage_with_matching_sidecar":
        replace_engine(b"\x00" * 100)                       # deserialize returns None
    elif damage == "undeserializable_with_matching_sidecar":
        replace_engine(engine[: len(MAGIC) + 40])            # deserialize raises
    elif damage == "sidecar_other_inputs":
        sidecar.write_text(json.dumps({**meta, "trt_version": "10.8.0"}))
    else:
        sidecar.unlink()
    caplog.set_level(logging.WARNING, logger="vidgen")
    rebuilt, path2, built = cache.get_or_build(onnx_files[0], "fp32", PROFILE, trt=trt)
    assert built and trt.builds == 2 and path2 == path and rebuilt == engine == path.read_bytes()
    assert "rebuilding" in caplog.text
    assert cache.get_or_build(onnx_files[0], "fp32", PROFILE, trt=trt)[2] is False


def test_concurrent_threads_build_once(onnx_files, tmp_path):
    trt = FakeTensorRT(build_delay=0.4)
    results = []

    def build():
        results.append(EngineCache(tmp_path, gpu=GPU).get_or_build(onnx_files[0], "fp32", PROFILE, trt=trt))

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert trt.builds == 1
    assert sorted(built for _, _, built in results) == [False, True]
    assert results[0][0] == results[1][0]


def _build_in_child(root, onnx_path, counter):
    trt = FakeTensorRT(build_delay=0.4, counter=counter)
    EngineCache(root, gpu=GPU).get_or_build(onnx_path, "fp32", PROFILE, trt=trt)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_concurrent_processes_build_once(onnx_files, tmp_path):
    counter = tmp_path / "builds.txt"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_build_in_child, args=(tmp_path / "engines", onnx_files[0], counter)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert counter.read_text().count("build") == 1
    assert len(list((tmp_path / "engines").glob("*.engine"))) == 1


def test_fp16_precision_per_tensorrt_version(onnx_files, tmp_path):
    fp32, fp16 = onnx_files
    # TensorRT 10: the fp32 graph with the FP16 flag, or an fp16 graph as a strongly typed network
    trt10 = FakeTensorRT("10.9.0")
    EngineCache(tmp_path, gpu=GPU).get_or_build(fp32, "fp16", PROFILE, trt=trt10)
    EngineCache(tmp_path, gpu=GPU).get_or_build(fp16, "fp16", PROFILE, trt=trt10)
    builds = [c for c in trt10.calls if c[0] == "build"]
    strongly_typed = 1 << int(trt10.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    assert builds == [("build", 0, ("FP16",)), ("build", strongly_typed, ())]
    # TensorRT 11 has no flag: an fp32 graph cannot become fp16, an fp16 graph builds as is
    trt11 = FakeTensorRT("11.1.0")
    with pytest.raises(GuardrailUnavailable, match="no FP16 builder flag.*fp16 ONNX graph") as err:
        EngineCache(tmp_path, gpu=GPU).get_or_build(fp32, "fp16", PROFILE, trt=trt11)
    assert "\n" not in str(err.value) and trt11.builds == 0
    EngineCache(tmp_path, gpu=GPU).get_or_build(fp16, "fp16", PROFILE, trt=trt11)
    assert [c for c in trt11.calls if c[0] in ("build", "set_flag", "create_network")] == [
        ("create_network", 0), ("build", 0, ())]
    shapes = [c for c in trt11.calls if c[0] == "set_shape"]
    assert shapes == [("set_shape", "images", (1, *SHAPE), (4, *SHAPE), (4, *SHAPE))]
    # an fp16 graph is never built as fp32
    with pytest.raises(GuardrailUnavailable, match="graph is fp16"):
        EngineCache(tmp_path, gpu=GPU).get_or_build(fp16, "fp32", PROFILE, trt=trt11)


def test_parser_errors_are_one_line(onnx_files, tmp_path):
    trt = FakeTensorRT(parse_errors=["In node 3 (Conv):\nUNSUPPORTED_NODE: weird", "second"])
    with pytest.raises(GuardrailUnavailable, match=r"could not parse the ONNX model: In node 3 \(Conv\): "
                                                   r"UNSUPPORTED_NODE: weird \(\+1 more\)") as err:
        EngineCache(tmp_path, gpu=GPU).get_or_build(onnx_files[0], "fp32", PROFILE, trt=trt)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("graph", [0, 1])
def test_runner_feeds_engine_through_tensor_addresses(onnx_files, tmp_path, graph):
    trt = FakeTensorRT()
    engine, _, _ = EngineCache(tmp_path, gpu=GPU).get_or_build(onnx_files[graph], "fp16", PROFILE, trt=trt)
    runner = cpu_runner(engine, trt)
    x = torch.randn(6, *SHAPE)                        # more than the profile's 4: run in chunks
    got = runner(x)
    assert got.dtype == torch.float32 and got.shape == (6, 2)
    torch.testing.assert_close(got, reference(x), atol=2e-2 if graph else 1e-5, rtol=0)
    assert [c[2][0] for c in trt.calls if c[0] == "set_input_shape"] == [4, 2]


# --- the ladder -------------------------------------------------------------------------------

def test_auto_picks_tensorrt_when_it_imports_and_cuda_is_there(onnx_files, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="vidgen")
    trt = FakeTensorRT("11.1.0")
    exported = []

    def export_fn(fp16):
        exported.append(fp16)
        return onnx_files[1] if fp16 else onnx_files[0]

    kwargs = dict(cache=EngineCache(tmp_path, gpu=GPU), trt=trt, precision="fp16", max_batch=4,
                  cuda_available=True, runner_factory=cpu_runner, chosen={})
    backend = select_backend("auto", tiny, export_fn, "cuda", **kwargs)
    assert backend.name == "tensorrt" and exported == [True]   # TensorRT 11 fp16: the fp16 graph
    x = torch.randn(3, *SHAPE)
    torch.testing.assert_close(backend(x), reference(x), atol=2e-2, rtol=0)
    assert select_backend("auto", tiny, export_fn, "cuda", **kwargs) is backend   # chosen once
    chosen = [r for r in caplog.records if "guard classifier" in r.getMessage()]
    assert len(chosen) == 1 and "tensorrt backend" in chosen[0].getMessage() and trt.builds == 1


def test_auto_falls_back_to_onnxruntime_without_tensorrt(onnx_files, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="vidgen")
    monkeypatch.setitem(sys.modules, "tensorrt", None)     # `import tensorrt` raises ImportError
    memo = {}
    backend = select_backend("auto", tiny, onnx_files[0], "cuda", cuda_available=True, chosen=memo)
    assert backend.name == "onnxruntime" and "CPUExecutionProvider" in backend.detail
    x = torch.randn(3, *SHAPE)
    torch.testing.assert_close(backend(x), reference(x), atol=1e-5, rtol=0)
    assert select_backend("auto", tiny, onnx_files[0], "cuda", cuda_available=True, chosen=memo) is backend
    chosen = [r.getMessage() for r in caplog.records if "guard classifier" in r.getMessage()]
    assert len(chosen) == 1 and "onnxruntime backend" in chosen[0]
    assert "skipped tensorrt: tensorrt is not importable" in chosen[0]


def test_auto_falls_back_to_torch_when_onnxruntime_fails(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="vidgen")
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    memo = {}
    backend = select_backend("auto", tiny, broken, "cpu", chosen=memo)
    assert backend.name == "torch"
    x = torch.randn(2, *SHAPE)
    torch.testing.assert_close(backend(x), reference(x))
    assert select_backend("auto", tiny, broken, "cpu", chosen=memo) is backend
    chosen = [r.getMessage() for r in caplog.records if "guard classifier" in r.getMessage()]
    assert len(chosen) == 1 and "torch backend" in chosen[0]
    assert "tensorrt: tensorrt is not importable" in chosen[0]
    assert "onnxruntime: could not load broken.onnx" in chosen[0]


def test_explicit_tensorrt_without_tensorrt_raises_one_line(onnx_files, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(GuardrailUnavailable, match="backend tensorrt cannot run: tensorrt is not importable") as err:
        select_backend("tensorrt", tiny, onnx_files[0], "cuda", cuda_available=True)
    assert "\n" not in str(err.value) and "pip install" in str(err.value)
    with pytest.raises(GuardrailUnavailable, match="no CUDA device") as err:
        select_backend("tensorrt", tiny, onnx_files[0], "cuda", trt=FakeTensorRT(), cuda_available=False)
    with pytest.raises(GuardrailUnavailable, match="guard backend onnxruntime cannot run: no ONNX model"):
        select_backend("onnxruntime", tiny, onnx_files[0].with_name("missing.onnx"), "cpu")


def test_onnx_only_and_torch_only_classifiers(onnx_files, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    assert select_backend("auto", None, onnx_files[0], "cpu", cache_root=tmp_path).name == "onnxruntime"
    with pytest.raises(GuardrailUnavailable, match="backend torch cannot run: an .onnx classifier has no torch"):
        select_backend("torch", None, onnx_files[0], "cpu")
    with pytest.raises(GuardrailUnavailable, match="backend onnxruntime cannot run: this classifier has no ONNX graph"):
        select_backend("onnxruntime", tiny, None, "cpu")
    assert select_backend("auto", tiny, None, "cpu").name == "torch"


def test_nothing_runs_raises(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)

    def no_weights():
        raise FileNotFoundError("open_nsfw weights missing")

    with pytest.raises(GuardrailUnavailable, match="no frame classifier backend can run.*open_nsfw weights missing"):
        select_backend("auto", no_weights, tmp_path / "missing.onnx", "cpu")


def test_backend_errors_raise_never_return_safe(tmp_path):
    class Fails(TinyClassifier):
        def forward(self, x):
            if x.shape[0] > 1:
                raise RuntimeError("CUDA error: an illegal memory access")
            return torch.full((1, 2), float("nan"))

    backend = select_backend("torch", Fails, tmp_path / "unused.onnx", "cpu")
    with pytest.raises(GuardrailUnavailable, match="torch backend.*illegal memory access"):
        backend(torch.randn(2, *SHAPE))
    with pytest.raises(GuardrailUnavailable, match="not probabilities"):
        backend(torch.randn(1, *SHAPE))


# --- CLI helpers ------------------------------------------------------------------------------

def test_build_engine_command(onnx_files, tmp_path, monkeypatch):
    path = build_engine_command(onnx_files[0], "fp16", 4, tmp_path, trt=FakeTensorRT(), gpu=GPU)
    assert path.parent == tmp_path and path.suffix == ".engine"
    # the render's choice with guard.batch_size = 4 finds this very engine
    assert batch_profile(4) == (1, 4, 4)
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(GuardrailUnavailable, match="TensorRT is not available.*pip install") as err:
        build_engine_command(onnx_files[0], "fp16", 8, tmp_path)
    assert "\n" not in str(err.value)


# --- real TensorRT ----------------------------------------------------------------------------

def _tensorrt_missing() -> str | None:
    try:
        import tensorrt  # noqa: F401
    except Exception as e:
        return f"tensorrt is not importable here ({type(e).__name__}); this test needs an NVIDIA GPU machine"
    if not torch.cuda.is_available():
        return "tensorrt imports but no CUDA device is visible"
    return None


@pytest.mark.skipif(_tensorrt_missing() is not None, reason=_tensorrt_missing() or "")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_real_tensorrt_engine_matches_torch(onnx_files, tmp_path, precision):
    import tensorrt as trt
    from vidgen.guard.tensorrt import has_fp16_flag

    graph = onnx_files[1] if precision == "fp16" and not has_fp16_flag(trt) else onnx_files[0]
    cache = EngineCache(tmp_path)
    engine, _, built = cache.get_or_build(graph, precision, (1, 4, 8), trt=trt)
    assert built and cache.get_or_build(graph, precision, (1, 4, 8), trt=trt)[2] is False
    runner = TensorRTRunner(engine, trt)
    for batch in (1, 3, 8):
        x = torch.randn(batch, *SHAPE)
        got = runner(x.cuda()).cpu()
        torch.testing.assert_close(got, reference(x), atol=1e-3 if precision == "fp32" else 2e-2, rtol=0)


def test_one_device_name_per_gpu(monkeypatch):
    """preflight loads the classifier for "cuda", the decode asks for the VAE's "cuda:0": one backend."""
    from vidgen.guard.backends import _resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert _resolve_device("cuda", True) == _resolve_device("cuda:0", True) == torch.device("cuda", 0)
    assert _resolve_device("cuda:1", True) == torch.device("cuda", 1)
    assert _resolve_device("cpu", True) == torch.device("cpu")
