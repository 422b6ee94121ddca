"""The GPU-only speed knobs on the CPU: SageAttention and fp8 matmuls are refused before any weight
loads, with one line each; a transformer that produces NaN stops the render before anything is
written; the prepared GPU benchmark's smoke mode runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vidgen.cli import main
from vidgen.config import SpeedConfig
from vidgen.speed import unsupported

ROOT = Path(__file__).resolve().parents[1]


def _render(capsys, cfg: dict, tmp_path: Path) -> tuple[int, list[str]]:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    code = main(["render", str(path)])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("setting,words", [({"attention_backend": "sage"}, "NVIDIA GPUs only"),
                                           ({"fp8_matmul": True}, "NVIDIA GPUs only")])
def test_gpu_only_knobs_are_refused_on_the_cpu(base_cfg, tmp_path, capsys, setting, words):
    cfg = base_cfg(speed=setting)
    code, err = _render(capsys, cfg, tmp_path)
    assert code == 2 and len(err) == 1 and words in err[0] and "speed." in err[0], err
    assert not Path(cfg["output"]["path"]).exists()


def test_refusals_name_what_is_missing(monkeypatch):
    import importlib.util

    cuda = torch.device("cuda")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert "pip install sageattention" in unsupported(SpeedConfig(attention_backend="sage"), cuda)[0]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert "8.9" in unsupported(SpeedConfig(fp8_matmul=True), cuda)[0]          # an A100: no float8 tensor cores
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert "torchao" in unsupported(SpeedConfig(fp8_matmul=True), cuda)[0]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())     # torchao present
    assert "model.dtype: bfloat16" in unsupported(SpeedConfig(fp8_matmul=True), cuda, torch.float16)[0]
    assert unsupported(SpeedConfig(fp8_matmul=True), cuda, torch.bfloat16) == []
    assert unsupported(SpeedConfig(), cuda) == []


def test_non_finite_output_stops_the_render(base_cfg, tiny_model, tmp_path, capsys):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model(), folder)
    weights = next((folder / "transformer").glob("*.safetensors"))
    tensors = load_file(weights)
    # finite weights (a NaN in the file is refused as it loads) whose product overflows float32 at the
    # first step: the render must stop there, not write a broken clip
    tensors["proj_out.weight"] = torch.full_like(tensors["proj_out.weight"], 3e38)
    save_file(tensors, weights)
    cfg = base_cfg()
    cfg["model"]["path"] = str(folder)
    code, err = _render(capsys, cfg, tmp_path)
    errors = [line for line in err if line.startswith("vidgen: error:")]        # besides the progress bars
    assert code == 2 and len(errors) == 1 and "step 1" in errors[0] and "NaN" in errors[0], err
    assert not any("Traceback" in line for line in err)
    out = Path(cfg["output"]["path"])
    assert not out.exists() and not list(out.parent.glob("*.latents.safetensors"))


@pytest.mark.slow
def test_gpu_dit_bench_smoke_mode_runs():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_dit.py"), "--smoke"], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "vidgen denoiser, sdpa auto" in done.stdout and "diffusers call, sdpa auto" in done.stdout
    assert "refused: speed.fp8_matmul" in done.stdout              # the CPU says why, and the bench goes on


def _float8_on_this_cpu(monkeypatch):
    """torchao's float8 path on the CPU: its hardware gate (compute capability 8.9) and vidgen's CUDA-only
    refusal lifted, so the quantisation and its composition with the memory plan run here."""
    pytest.importorskip("torchao")
    import torchao.quantization.quant_api as quant_api

    import vidgen.speed

    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda granularity: None)
    monkeypatch.setattr(vidgen.speed, "_fp8_problems", lambda speed, device, dtype=None: [])


def test_fp8_matmuls_compose_with_fp8_storage(base_cfg, tmp_path, monkeypatch):
    """speed.fp8_matmul under bf16 storage and under the memory plan's fp8 storage (resident and
    streamed): every block linear ends as a torchao float8 weight with per-row scales, its casting hook
    inert, the rest untouched; the render stays within float8 rounding of the plain one."""
    import vidgen
    from torchao.quantization import Float8Tensor
    from vidgen.resume import read_latents
    from vidgen.weights import streamed

    _float8_on_this_cpu(monkeypatch)
    cfg = base_cfg("wan2.2-t2v-a14b", sampling={"steps": 3})
    cfg["model"]["dtype"] = "bfloat16"          # torchao's per-row float8 takes bfloat16 weights

    def render(name: str, **extra):
        pipe = vidgen.Pipeline.from_config({**cfg, **extra})
        result = pipe.generate(output={"path": str(tmp_path / f"{name}.mp4")})
        return pipe, read_latents(result.latents_path)[0]

    _, ref = render("ref")
    _, stored = render("stored", memory={"weights": "fp8"})
    outs = {}
    for name, memory in [("bf16", {"weights": "bf16"}), ("fp8", {"weights": "fp8"}),
                         ("streamed", {"weights": "fp8", "placement": "stream_blocks"})]:
        pipe, outs[name] = render(name, memory=memory, speed={"fp8_matmul": True})
        for model in pipe.components.experts:
            linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
            assert all(isinstance(m.weight, Float8Tensor) == n.startswith("blocks.") for n, m in linears.items()), name
            assert streamed(model) == (name == "streamed")    # re-streamed
        assert torch.isfinite(outs[name]).all()
    scale = ref.abs().max().item()
    for name, out in outs.items():
        assert 0 < (out - ref).abs().max().item() <= 0.25 * scale, name
    assert 0 < (outs["fp8"] - stored).abs().max().item() <= 0.25 * scale     # float8 matmuls, not a no-op
    assert torch.equal(outs["fp8"], outs["streamed"])                        # streaming changes no numerics
    print({name: round((out - ref).abs().max().item() / scale, 4) for name, out in {**outs, "stored": stored}.items()})
