"""Diffusion forcing (SkyReels-V2 DF, vidgen.forcing): parity with diffusers' SkyReelsV2DiffusionForcingPipeline
on a tiny model, synchronous and asynchronous, one window and a long take; resume mid-take bit for bit;
the refusals; `vidgen plan` for the presets without weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import vidgen
from vidgen import forcing
from vidgen.cli import main
from vidgen.presets import load_config
from vidgen.resume import load, read_latents

ROOT = Path(__file__).resolve().parents[1]
DF = "skyreels-v2-df"
PROMPT, NEGATIVE = "a red circle moving right on a black background", "blurry low quality"


def _cfg(base_cfg, tmp_path, name: str, frames: int, **settings):
    cfg = base_cfg(DF, num_frames=frames, fps=24, output={"path": str(tmp_path / f"{name}.mp4")})
    cfg["forcing"] = settings
    return cfg


def _noise(x: torch.Tensor) -> torch.Tensor:
    """A fixed stand-in for the shared frames' noise, the same on both sides."""
    return torch.sin(torch.arange(x.numel(), dtype=torch.float32) * 0.7).view(x.shape).to(x.dtype)


CASES = {   # num_frames, forcing settings
    "sync": (9, {}),
    "async": (33, {"ar_step": 2, "causal_block_size": 3}),
    "long": (33, {"base_num_frames": 17, "overlap_history": 9}),
    "long-async-addnoise": (45, {"base_num_frames": 29, "overlap_history": 5, "ar_step": 1, "causal_block_size": 2,
                                 "addnoise_condition": 20}),
}


@pytest.mark.parametrize("case", [c if c in ("sync", "long-async-addnoise") else pytest.param(c, marks=pytest.mark.slow)
                                  for c in CASES])
def test_parity_with_diffusers(base_cfg, tiny_model, tmp_path, monkeypatch, case):
    """The same latents as diffusers' pipeline (its latent output), within 1e-5 (they come out equal)."""
    from diffusers import SkyReelsV2DiffusionForcingPipeline

    frames, settings = CASES[case]
    monkeypatch.setattr(forcing, "condition_noise", lambda like, *_: _noise(like))
    ours = read_latents(vidgen.render(_cfg(base_cfg, tmp_path, case, frames, **settings)).latents_path)[0]
    pipe = SkyReelsV2DiffusionForcingPipeline.from_pretrained(tiny_model(DF))
    pipe.set_progress_bar_config(disable=True)
    monkeypatch.setattr(torch, "randn_like", _noise)     # diffusers draws the shared frames' noise with it
    theirs = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=64, width=64, num_frames=frames, num_inference_steps=4,
                  guidance_scale=4.0, generator=torch.Generator().manual_seed(7), output_type="latent", fps=24,
                  ar_step=settings.get("ar_step", 0), causal_block_size=settings.get("causal_block_size"),
                  overlap_history=settings.get("overlap_history"), base_num_frames=settings.get("base_num_frames", 97),
                  addnoise_condition=settings.get("addnoise_condition", 0)).frames
    assert ours.shape == theirs.shape == (1, 16, (frames - 1) // 4 + 1, 8, 8)
    assert (ours - theirs.float()).abs().max().item() <= 1e-5


def test_the_take_is_laid_out_in_latent_windows():
    """257 frames in 97-frame windows sharing 17: three windows whose new frames tile the take once."""
    lay = forcing.Layout(65, 25, 5, 5, 5, 20.0, 1, tuple(range(30, 0, -1)), "unipc")
    assert [(w.start, w.frames, w.prefix) for w in lay.windows] == [(0, 25, 0), (20, 25, 5), (40, 25, 5)]
    new = [range(w.start + w.prefix, w.start + w.frames) for w in lay.windows]
    assert sorted(f for r in new for f in r) == list(range(65))
    assert lay.steps == sum(lay.rows) and lay.locate(lay.rows[0]) == (1, 0) and lay.locate(lay.steps) == (3, 0)
    # asynchronous: each block of 5 frames 5 steps behind, so a window takes 30 + 5 x 4 rows
    assert lay.rows[0] == 30 + 5 * 4


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["mid-window", "window-start"])
def test_resume_mid_take_is_bit_identical(base_cfg, tmp_path, stop):
    """Stopped in the second window, or just as it starts, the take resumes to the same latents; the
    checkpoint holds the whole take and each frame's history."""
    frames, settings = CASES["long-async-addnoise"]
    whole = vidgen.render(_cfg(base_cfg, tmp_path, "whole", frames, **settings))
    cfg = _cfg(base_cfg, tmp_path, "cut", frames, **settings)
    cfg["sampling"] = {**cfg["sampling"], "checkpoint_every": 1}
    first = forcing.Layout(12, 8, 2, 2, 1, 20.0, 1, tuple(range(4)), "unipc").rows[0]
    at = first + 2 if stop == "mid-window" else first

    def stop_at(p):
        if p.stage == "denoise" and p.step == at:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        vidgen.render(cfg, callback=stop_at)
    state, _ = load(tmp_path / "cut.resume.safetensors")
    assert state.forcing and state.step == at and state.latents.shape == (1, 16, 12, 8, 8)
    resumed = vidgen.render(cfg, resume=True)
    assert torch.equal(read_latents(whole.latents_path)[0], read_latents(resumed.latents_path)[0])


def test_refusals_come_at_once(base_cfg, tmp_path, capsys):
    """Every forcing problem in one line, exit code 2, nothing written."""
    cfg = _cfg(base_cfg, tmp_path, "bad", 33, base_num_frames=17, ar_step=1)
    cfg["sampling"] = {**cfg["sampling"], "solver": "dpmpp"}
    cfg["speed"] = {"step_cache": "first_block"}
    (tmp_path / "bad.yaml").write_text(json.dumps(cfg))
    assert main(["render", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    for part in ("forcing.overlap_history", "sampling.solver", "speed.step_cache"):
        assert part in err, err
    assert not list(tmp_path.glob("bad.*[!l]"))

    # a block that does not divide the windows; forcing settings on a model without diffusion forcing
    (tmp_path / "block.yaml").write_text(json.dumps(_cfg(base_cfg, tmp_path, "block", 25, causal_block_size=3)))
    assert main(["render", str(tmp_path / "block.yaml")]) == 2
    assert "forcing.causal_block_size: 3 latent frames do not divide [7]" in capsys.readouterr().err
    wan = base_cfg(output={"path": str(tmp_path / "wan.mp4")})
    wan["forcing"] = {"ar_step": 5}
    (tmp_path / "wan.yaml").write_text(json.dumps(wan))
    assert main(["render", str(tmp_path / "wan.yaml")]) == 2
    assert "forcing.ar_step: is set, but wan2.1-t2v is no diffusion-forcing model" in capsys.readouterr().err


@pytest.mark.parametrize("preset", ["skyreels-v2-df-1.3b-540p", "skyreels-v2-df-1.3b-540p-long", "skyreels-v2-df-14b-540p",
                                    "skyreels-v2-df-14b-720p"])
def test_plan_for_the_presets_without_weights(capsys, preset):
    """From the shipped JSON of the size the preset's model.path names (no folder there)."""
    folder = load_config(ROOT / "configs" / f"{preset}.yaml", ["prompt=x"]).model.path
    assert main(["plan", str(ROOT / "configs" / f"{preset}.yaml"), "prompt=x", f"model.path=/nowhere/{Path(folder).name}",
                 "model.device=cuda",
                 "memory.device_budget=80GiB", "memory.host_budget=96GiB", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["fits"]


def test_the_causal_mask_is_planned(capsys):
    """Asynchronous blocks of 5 frames mask attention with a [tokens, tokens] matrix: the plan counts it."""
    def denoise(*extra):
        assert main(["plan", str(ROOT / "configs/skyreels-v2-df-1.3b-540p-long.yaml"), "prompt=x",
                     "model.path=/nowhere/SkyReels-V2-DF-1.3B-540P-Diffusers",
                     "model.device=cuda", "memory.device_budget=80GiB", "memory.host_budget=96GiB", *extra, "--json"]) == 0
        stages = json.loads(capsys.readouterr().out)["stages"]
        return next(s for s in stages if s["name"].startswith("denoising"))["device_activations"]

    tokens = 25 * (544 // 16) * (960 // 16)        # a 97-frame window's latent tokens at 960x544
    more = denoise() - denoise("forcing.causal_block_size=1", "forcing.ar_step=0")
    # the boolean mask, kept through the forward, and its bfloat16 copy in each attention call
    assert tokens ** 2 < more <= tokens ** 2 * 3


@pytest.mark.slow
def test_a_workflow_long_take_on_a_forcing_model_is_one_render(tiny_model, tmp_path, monkeypatch):
    """A queued shot longer than the window is not cut into windows by the queue: one render makes the take."""
    from test_continuity import _run, _wf
    from vidgen.queue.workflow import load_workflow, plan_jobs

    monkeypatch.chdir(tmp_path)
    wf = load_workflow(_wf(tmp_path, tiny_model(DF), """\
        - {name: take, prompt: a red circle moving right, num_frames: 33,
           overrides: {forcing.base_num_frames: 17, forcing.overlap_history: 9}}
        """))
    assert [s.config.num_frames for s in wf.shots] == [33]
    jobs = plan_jobs(wf)
    _run(jobs)
    assert read_latents(Path(wf.shots[0].config.output.path).with_suffix(".latents.safetensors"))[0].shape[2] == 9
