"""Speed knobs (vidgen.speed) on tiny models, CPU: each engages, renders still run, fallbacks hold."""

from __future__ import annotations

import logging

import pytest
import torch

import vidgen
import vidgen.speed
from vidgen.config import SpeedConfig
from vidgen.errors import ConfigError
from vidgen.pipeline import Pipeline
from vidgen.resume import read_latents
from vidgen.speed import apply_speed, cache_context, reset_step_cache


def render_latents(cfg: dict) -> tuple[torch.Tensor, vidgen.RenderResult]:
    result = vidgen.render(cfg)
    assert result.num_frames == cfg["num_frames"]
    return read_latents(result.latents_path)[0], result


def speed_cfg(base_cfg, variant="wan2.1-t2v", **speed):
    """The tiny render config with `speed` set; renders overwrite each other's output."""
    return base_cfg(variant, speed=speed, output={"overwrite": True})


def count_calls(module: torch.nn.Module) -> list[int]:
    calls = [0]
    module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


# ---------------------------------------------------------------------------------------- attention

def test_attention_math_matches_auto_and_engages(base_cfg, monkeypatch):
    used = []
    real = vidgen.speed.sdpa_kernel

    def counting(backend):
        used.append(backend)
        return real(backend)

    monkeypatch.setattr(vidgen.speed, "sdpa_kernel", counting)
    auto, _ = render_latents(speed_cfg(base_cfg))
    used.clear()
    math, _ = render_latents(speed_cfg(base_cfg, attention_backend="sdpa_math"))
    steps = base_cfg()["sampling"]["steps"]
    assert used == [torch.nn.attention.SDPBackend.MATH] * (1 + 2 * steps)   # probe + cond/uncond per step
    torch.testing.assert_close(math, auto, rtol=0, atol=1e-5)


def test_unavailable_attention_backend_warns_and_stays_auto(base_cfg, caplog):
    auto, _ = render_latents(speed_cfg(base_cfg))
    with caplog.at_level(logging.WARNING, logger="vidgen"):
        got, _ = render_latents(speed_cfg(base_cfg, attention_backend="sdpa_efficient"))
    assert any("sdpa_efficient is not available on cpu" in r.message and "using auto" in r.message
               for r in caplog.records)
    assert torch.equal(got, auto)


# ------------------------------------------------------------------------------------------ compile

@pytest.fixture
def fake_compile(monkeypatch):
    """torch.compile stand-in that returns the function itself, counting the compiled calls."""
    calls = [0]

    def compile(fn, *args, **kwargs):
        def compiled(*a, **k):
            calls[0] += 1
            return fn(*a, **k)
        return compiled

    monkeypatch.setattr(torch, "compile", compile)
    return calls


@pytest.mark.parametrize("mode", ["blocks", "full"])
def test_compile_engages(base_cfg, fake_compile, mode):
    eager, _ = render_latents(speed_cfg(base_cfg))
    pipe = Pipeline.from_config(speed_cfg(base_cfg, compile=mode))
    model = pipe.components.experts[0]
    assert isinstance(model._compiled_call_impl, vidgen.speed._CompileGuard)
    blocks = [m for m in model.modules() if type(m).__name__ == "WanTransformerBlock"]
    assert all((b._compiled_call_impl is not None) == (mode == "blocks") for b in blocks)
    got = read_latents(pipe.generate().latents_path)[0]
    steps = base_cfg()["sampling"]["steps"]
    assert fake_compile[0] == 2 * steps * (len(blocks) if mode == "blocks" else 1)
    assert torch.equal(got, eager)


@pytest.mark.slow
def test_compile_blocks_really_compiles(base_cfg, caplog):
    """One real torch.compile (regional) render: same frames, latents within float tolerance of eager."""
    from torch._dynamo.utils import counters

    eager, _ = render_latents(speed_cfg(base_cfg))
    compiled_before = counters["frames"]["ok"]
    with caplog.at_level(logging.WARNING, logger="vidgen"):
        got, _ = render_latents(speed_cfg(base_cfg, compile="blocks"))
    assert counters["frames"]["ok"] > compiled_before
    assert not [r for r in caplog.records if r.message.startswith("speed.compile")]
    torch.testing.assert_close(got, eager, rtol=0, atol=1e-4)


@pytest.mark.parametrize("when", ["setup", "first call"])
def test_compile_failure_falls_back_with_one_warning(base_cfg, monkeypatch, caplog, when):
    def broken(fn, *args, **kwargs):
        if when == "setup":
            raise RuntimeError("torch.compile is not supported on Python 3.99+")

        def compiled(*a, **k):
            raise RuntimeError("InductorError: C compiler not found")
        return compiled

    eager, _ = render_latents(speed_cfg(base_cfg, "wan2.2-t2v-a14b"))     # two experts, still one warning
    monkeypatch.setattr(torch, "compile", broken)
    cfg = speed_cfg(base_cfg, "wan2.2-t2v-a14b", compile="blocks")
    with caplog.at_level(logging.WARNING, logger="vidgen"):
        pipe = Pipeline.from_config(cfg)
        got = read_latents(pipe.generate().latents_path)[0]
    warned = [r.message for r in caplog.records if r.message.startswith("speed.compile")]
    assert len(warned) == 1 and "running eagerly" in warned[0]
    assert torch.equal(got, eager)
    assert all(m._compiled_call_impl is None for e in pipe.components.experts for m in e.modules())


def test_genuine_error_still_raises_and_compile_stays(base_cfg, fake_compile, caplog):
    pipe = Pipeline.from_config(speed_cfg(base_cfg, compile="full"))
    model = pipe.components.experts[0]
    with caplog.at_level(logging.WARNING, logger="vidgen"), pytest.raises(RuntimeError):
        model(hidden_states=torch.randn(1, 5, 3, 8, 8), timestep=torch.tensor([500]),     # wrong channels
              encoder_hidden_states=torch.randn(1, 8, 32), return_dict=False)
    assert not [r for r in caplog.records if r.message.startswith("speed.compile")]
    assert isinstance(model._compiled_call_impl, vidgen.speed._CompileGuard)


# --------------------------------------------------------------------------------------- step cache

@pytest.mark.parametrize("kind", ["first_block", "sea"])
def test_step_cache_engages_and_skips_work(base_cfg, kind):
    from diffusers.hooks import HookRegistry

    steps = base_cfg()["sampling"]["steps"]
    plain, _ = render_latents(speed_cfg(base_cfg))
    pipe = Pipeline.from_config(speed_cfg(base_cfg, step_cache=kind, cache_threshold=5.0))
    model = pipe.components.experts[0]
    assert model.is_cache_enabled and HookRegistry.check_if_exists_or_initialize(model.blocks[-1]).hooks
    last_ffn = count_calls(model.blocks[-1].ffn)
    cached = read_latents(pipe.generate().latents_path)[0]
    assert last_ffn[0] < 2 * steps                                     # some steps reused the cache
    assert torch.isfinite(cached).all() and not torch.equal(cached, plain)
    assert (cached - plain).abs().max() < 0.5 * plain.abs().max()      # an approximation, not noise
    again = read_latents(pipe.generate(seed=7).latents_path)[0]
    assert torch.equal(again, cached)                                  # nothing leaks across renders


@pytest.mark.parametrize("kind", ["first_block", "sea"])
def test_step_cache_with_a_tiny_threshold_changes_nothing(base_cfg, kind):
    plain, _ = render_latents(speed_cfg(base_cfg))
    cached, _ = render_latents(speed_cfg(base_cfg, step_cache=kind, cache_threshold=1e-6))
    assert torch.equal(cached, plain)


def test_sea_cache_on_image_to_video_watches_the_noisy_latents(tiny_model):
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel.from_pretrained(tiny_model("wan2.2-i2v-a14b") / "transformer")
    config = vidgen.speed._cache_config(SpeedConfig(step_cache="sea"), model)
    x = torch.randn(1, model.config.in_channels, 3, 8, 8)                 # [latents, mask + image]
    got = config.raw_vision_callback(model, (), {"hidden_states": x})
    assert len(got) == 1 and torch.equal(got[0], x[0, :model.config.out_channels])


def test_mag_cache_is_refused_with_what_is_available(base_cfg):
    problems = vidgen.speed.unsupported(SpeedConfig(step_cache="mag"))
    assert len(problems) == 1 and "available: none, first_block, sea" in problems[0]
    pipe = Pipeline.from_config(speed_cfg(base_cfg))
    with pytest.raises(ConfigError, match="'mag' is not available"):
        apply_speed(pipe.components, SpeedConfig(step_cache="mag"))
    assert not pipe.components.experts[0].is_cache_enabled


def test_cache_context_is_a_no_op_without_a_cache(base_cfg, monkeypatch):
    import contextlib

    model = Pipeline.from_config(speed_cfg(base_cfg)).components.experts[0]
    assert not getattr(model, "is_cache_enabled", False)
    ctx = cache_context(model, "cond", step_index=0, num_steps=4, sigma=0.9)
    assert isinstance(ctx, contextlib.nullcontext)      # the model's own cache_context is never entered
    monkeypatch.setattr(model, "_reset_stateful_cache", lambda: pytest.fail("reset a cache that is off"),
                        raising=False)
    reset_step_cache([model])
