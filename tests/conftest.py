"""Shared fixtures: tiny random-weight Wan pipelines built once per test session."""

from __future__ import annotations

import logging
import os

import pytest
import torch

# Triton kernels run on the CPU under Triton's interpreter where there is no GPU; Triton reads the
# variable when it is imported, so it is set before anything (diffusers, torch) imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from vidgen.quiet import quiet_libraries
from vidgen.tiny import TINY_VARIANTS, build_tiny_pipeline

logging.getLogger("vidgen").setLevel(logging.WARNING)
quiet_libraries()      # the libraries' own progress bars would land in captured stderr


def pytest_collection_modifyitems(items):
    """The Triton interpreter sweeps (every test on the `triton_ops` fixture) are slow on a CPU."""
    for item in items:
        if "triton_ops" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """tiny_model(variant) -> folder of a tiny pipeline of that variant (built on first use)."""
    root = tmp_path_factory.mktemp("models")
    built: dict[str, object] = {}

    def get(variant: str = "wan2.1-t2v", first_last: bool = False):
        assert variant in TINY_VARIANTS
        key = variant + ("-flf" if first_last else "")
        if key not in built:
            built[key] = build_tiny_pipeline(root / key, variant, seed=0, first_last=first_last)
        return built[key]

    return get


@pytest.fixture
def base_cfg(tiny_model, tmp_path):
    """A small render config (dict) for the tiny Wan2.1 model writing into tmp_path."""
    def make(variant: str = "wan2.1-t2v", **extra):
        cfg = {"model": {"path": str(tiny_model(variant)), "device": "cpu"},
               "prompt": "a red circle moving right on a black background",
               "negative_prompt": "blurry low quality", "size": "64x64", "num_frames": 9, "fps": 8, "seed": 7,
               # the diffusers grid, so renders can be compared with diffusers' WanPipeline
               "sampling": {"steps": 4, "guidance_scale": 4.0, "schedule": "diffusers"},
               "output": {"path": str(tmp_path / "out" / "clip.mp4")}}
        for key, value in extra.items():
            cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and key in cfg else value
        return cfg
    return make
