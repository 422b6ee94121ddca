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
    assert unsupported(SpeedConfig(), cuda) == []


def test_non_finite_output_stops_the_render(base_cfg, tiny_model, tmp_path, capsys):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model(), folder)
    weights = next((folder / "transformer").glob("*.safetensors"))
    tensors = load_file(weights)
    tensors["proj_out.bias"] = torch.full_like(tensors["proj_out.bias"], float("nan"))
    save_file(tensors, weights)
    cfg = base_cfg()
    cfg["model"]["path"] = str(folder)
    code, err = _render(capsys, cfg, tmp_path)
    errors = [line for line in err if line.startswith("vidgen: error:")]        # besides the progress bars
    assert code == 2 and len(errors) == 1 and "step 1" in errors[0] and "NaN" in errors[0], err
    assert not any("Traceback" in line for line in err)
    out = Path(cfg["output"]["path"])
    assert not out.exists() and not list(out.parent.glob("*.latents.safetensors"))


def test_gpu_dit_bench_smoke_mode_runs():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_dit.py"), "--smoke"], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "vidgen denoiser, sdpa auto" in done.stdout and "diffusers call, sdpa auto" in done.stdout
    assert "refused: speed.fp8_matmul" in done.stdout              # the CPU says why, and the bench goes on
