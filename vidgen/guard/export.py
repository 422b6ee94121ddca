"""ONNX export of a frame-safety classifier, checked before it is written.

The classifier contract: input [B, ...] (OpenNSFW: [B, 3, 224, 224]), output [B, 2] softmax
probabilities, column 1 = unsafe. The exported graph has one input `images` and one output `probs`
with a dynamic batch dimension, so one file serves onnxruntime and TensorRT engines of any batch
profile. `fp16=True` exports the module in half precision: an fp16 graph is what TensorRT 11 needs
for fp16 engines, since it removed the FP16 builder flag (strongly typed networks only).
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from pathlib import Path

import torch

from ..errors import GuardrailUnavailable
from ..io import atomic_write_bytes

log = logging.getLogger("vidgen")

INPUT_NAME = "images"
OUTPUT_NAME = "probs"

# Largest |ORT - torch| allowed on the probabilities; fp16 carries ~3 significant digits.
PARITY_ATOL = {False: 1e-4, True: 2e-2}


def export_onnx(module: torch.nn.Module, path: str | os.PathLike, *, example: torch.Tensor,
                max_batch: int = 32, fp16: bool = False) -> Path:
    """Export `module` to a self-contained ONNX file at `path`, verified before it is written.

    Args:
        module: classifier taking `example`-shaped input, returning [B, 2] probabilities.
        path: destination; written through a temporary file and os.replace, so a failed export or
            check never leaves a half-written or unchecked file there.
        example: an input batch [B, ...] in float32; only its per-sample shape and values are used.
        max_batch: largest batch the dynamic dimension declares (TensorRT profiles stay within it).
        fp16: export an fp16 graph (fp16 input, weights and output).
    Returns:
        `path` as a Path.
    Raises:
        GuardrailUnavailable: the export failed, the checker rejected the graph, or onnxruntime's
            outputs differ from the module's at batch 1 or 3.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    path = Path(path)
    module = module.eval()
    data = _export_bytes(module, example, max_batch=max_batch, fp16=fp16)
    check_onnx(data)
    check_parity(module, data, example, batch_sizes=[b for b in (1, 3) if b <= max_batch], fp16=fp16)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data)
    log.info("exported %s (%s, %.1f MB, batch 1..%d)", path, "fp16" if fp16 else "fp32", len(data) / 1e6, max_batch)
    return path


def _export_bytes(module: torch.nn.Module, example: torch.Tensor, *, max_batch: int, fp16: bool) -> bytes:
    # A copy, so the caller's module keeps its precision.
    target = copy.deepcopy(module).half() if fp16 else module
    sample = example[:1].to(torch.float16 if fp16 else torch.float32)
    if max_batch >= 2:
        # Batch 2, not 1: torch.export specialises a size-1 dimension to a constant.
        args = (sample.expand(2, *sample.shape[1:]).contiguous(),)
        dynamic_shapes = ({0: torch.export.Dim("batch", min=1, max=max_batch)},)
    else:
        args, dynamic_shapes = (sample,), None
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")   # exporter deprecation chatter, not about this model
            program = torch.onnx.export(target, args, None, dynamo=True, dynamic_shapes=dynamic_shapes,
                                        input_names=[INPUT_NAME], output_names=[OUTPUT_NAME], verbose=False)
    except ImportError as e:
        raise GuardrailUnavailable(f"ONNX export needs onnxscript: pip install onnxscript ({e})") from e
    except Exception as e:
        raise GuardrailUnavailable(f"ONNX export of {type(module).__name__} failed: {one_line(e)}") from e
    # model_proto keeps the weights inside the graph; export(f=path) would put them in a side file
    # that the engine-cache key (a hash of these bytes) and OnnxParser.parse(bytes) would not see.
    return program.model_proto.SerializeToString()


def check_onnx(data: bytes) -> None:
    """Run onnx.checker on a serialized model; raises GuardrailUnavailable naming the problem."""
    import onnx

    try:
        onnx.checker.check_model(onnx.load_from_string(data), full_check=True)
    except Exception as e:
        raise GuardrailUnavailable(f"the exported ONNX graph is invalid: {one_line(e)}") from e


def check_parity(module: torch.nn.Module, data: bytes, example: torch.Tensor, *,
                 batch_sizes=(1, 3), fp16: bool = False, atol: float | None = None) -> float:
    """Compare onnxruntime (CPU) on `data` with `module` in float32; returns the largest difference.

    Raises GuardrailUnavailable when any batch size differs by more than `atol` (default by precision).
    """
    import onnxruntime as ort

    atol = PARITY_ATOL[fp16] if atol is None else atol
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    input_dtype = torch.float16 if fp16 else torch.float32
    reference = copy.deepcopy(module).float().eval()
    worst = 0.0
    for batch in batch_sizes:
        x = parity_batch(example, batch)
        with torch.no_grad():
            want = reference(x).float()
        got = torch.from_numpy(session.run([OUTPUT_NAME], {INPUT_NAME: x.to(input_dtype).numpy()})[0]).float()
        if got.shape != want.shape:
            raise GuardrailUnavailable(f"ONNX output shape {tuple(got.shape)} != torch {tuple(want.shape)} "
                                       f"at batch {batch}")
        diff = float((got - want).abs().max())
        worst = max(worst, diff)
        if not diff <= atol:    # also catches NaN
            raise GuardrailUnavailable(f"onnxruntime differs from torch by {diff:.3g} (> {atol:g}) at batch {batch}; "
                                       "the exported graph does not match the module")
    return worst


def parity_batch(example: torch.Tensor, batch: int) -> torch.Tensor:
    """A float32 batch [batch, ...] cycling through `example`'s samples, each nudged so rows differ."""
    gen = torch.Generator().manual_seed(batch)
    rows = example.float()[torch.arange(batch) % example.shape[0]]
    scale = float(rows.std()) if rows.numel() > 1 else 1.0
    return rows + 0.05 * (scale or 1.0) * torch.randn(rows.shape, generator=gen)


def onnx_input_is_fp16(data: bytes) -> bool:
    """Whether the serialized model's first graph input is float16 (an fp16 graph)."""
    import onnx

    model = onnx.load_from_string(data)
    return model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16


def one_line(e: BaseException) -> str:
    """An exception as one line of at most ~300 characters, for GuardrailUnavailable messages."""
    text = " ".join(str(e).split())
    return (text[:300] + "..." if len(text) > 300 else text) or type(e).__name__
