"""Interrupted renders resume bit-identically; expert switching counts match Wan's."""

from __future__ import annotations

import pytest
import torch

import vidgen
from vidgen.cli import main
from vidgen.resume import read_latents


def _stop_at(step: int):
    def callback(p):
        if p.stage == "denoise" and p.step == step:
            raise KeyboardInterrupt
    return callback


@pytest.mark.parametrize("solver", ["unipc", "dpmpp", "euler"])
def test_interrupt_and_resume_is_bit_identical(base_cfg, tmp_path, solver):
    sampling = {"steps": 7, "solver": solver, "schedule": "wan", "shift": 5.0, "checkpoint_every": 2}
    whole = vidgen.render(base_cfg(sampling=sampling, output={"path": str(tmp_path / "whole.mp4")}))
    cfg = base_cfg(sampling=sampling, output={"path": str(tmp_path / "cut.mp4")})
    with pytest.raises(KeyboardInterrupt):
        vidgen.render(cfg, callback=_stop_at(5))
    assert not (tmp_path / "cut.mp4").exists() and (tmp_path / "cut.resume.safetensors").exists()
    resumed = vidgen.render(cfg, resume=True)
    a, b = read_latents(whole.latents_path)[0], read_latents(resumed.latents_path)[0]
    assert torch.equal(a, b)
    assert not (tmp_path / "cut.resume.safetensors").exists()      # removed once the latents are safe


def test_resume_with_random_seed_and_time_in_path(base_cfg, tmp_path):
    cfg = base_cfg(seed=None, sampling={"steps": 5, "checkpoint_every": 1, "schedule": "wan", "shift": 3.0},
                   output={"path": str(tmp_path / "{time}-{seed}.mp4")})
    with pytest.raises(KeyboardInterrupt):
        vidgen.render(cfg, callback=_stop_at(3))
    ckpt = next(tmp_path.glob("*.resume.safetensors"))
    result = vidgen.render(cfg, resume=True)
    assert result.path.stem == ckpt.name.split(".")[0] and str(result.seed) in result.path.stem


def test_mismatched_resume_is_refused(base_cfg, tmp_path, capsys):
    import yaml

    cfg = base_cfg(sampling={"steps": 5, "checkpoint_every": 1, "schedule": "wan", "shift": 3.0})
    with pytest.raises(KeyboardInterrupt):
        vidgen.render(cfg, callback=_stop_at(3))
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code = main(["render", str(path), "prompt=a blue square", "sampling.steps=6", "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "different settings" in err[0]
    assert "prompt is" in err[0] and "sampling.steps is 5 there, 6 here" in err[0]


@pytest.mark.parametrize("variant,steps,shift,boundary,expected", [
    ("wan2.2-t2v-a14b", 40, 12.0, 0.875, (26, 14)),
    ("wan2.2-i2v-a14b", 40, 5.0, 0.9, (15, 25)),
])
def test_expert_step_counts(base_cfg, tmp_path, variant, steps, shift, boundary, expected):
    from PIL import Image

    calls = {0: 0, 1: 0}
    pipe_cfg = base_cfg(variant, sampling={"steps": steps, "shift": shift, "boundary": boundary, "schedule": "wan",
                                           "guidance_scale": 1.0, "guidance_scale_2": 1.0, "checkpoint_every": 0})
    if variant.startswith("wan2.2-i2v"):
        Image.new("RGB", (64, 64), (90, 120, 200)).save(tmp_path / "i.png")
        pipe_cfg["image"] = str(tmp_path / "i.png")
    pipe = vidgen.Pipeline.from_config(pipe_cfg)
    for k, expert in enumerate(pipe.components.experts):
        expert.register_forward_pre_hook(lambda m, a, k=k: calls.__setitem__(k, calls[k] + 1))
    pipe.generate()
    assert (calls[0], calls[1]) == expected


def test_expert_offload_swaps_once_per_render(base_cfg, monkeypatch):
    """Only the active expert lives on the device: one swap, high-noise expert out, low-noise in; a
    warm pipeline's next render finds the low-noise expert there and swaps back; before the decode
    both leave. (Recorders note where they were moved: this machine has no second device.)"""
    from types import SimpleNamespace

    from vidgen.residency import ExpertSwitch, Residency

    class Recorder(torch.nn.Linear):
        def __init__(self, name, log, at):
            super().__init__(2, 2)
            self.name, self.log, self.at = name, log, torch.device(at)

        def to(self, device):
            self.log.append((self.name, str(device)))
            self.at = torch.device(device)
            return self

    monkeypatch.setattr(ExpertSwitch, "_on", staticmethod(lambda m: m.at))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    moves = []
    a, b = Recorder("high", moves, "cuda"), Recorder("low", moves, "cpu")     # as the loader places them
    swap = Residency(SimpleNamespace(swaps=True, streams=False, expert_in_files=False), torch.device("cuda"))
    placement = swap.switch([a, b])
    for index in [0, 0, 0, 1, 1]:
        placement.activate(index)
    assert moves == [("high", "cpu"), ("low", "cuda")]      # one swap
    swap.switch([a, b]).activate(0)
    assert moves[2:] == [("low", "cpu"), ("high", "cuda")]
    placement.release()
    assert moves[4:] == [("high", "cpu")] and (a.at.type, b.at.type) == ("cpu", "cpu")

    pipe = vidgen.Pipeline.from_config(base_cfg("wan2.2-t2v-a14b", sampling={"steps": 6, "schedule": "wan",
                                                                            "shift": 12.0}))
    seen = []
    placement = ExpertSwitch(pipe.components.experts, pipe.components.device, swap=False)
    placement.activate = seen.append        # record the order the denoiser asks for experts
    monkeypatch.setattr(pipe.residency, "switch", lambda *a, **k: placement)
    pipe.generate(seed=2)
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == 1     # one switch, high-noise first


def test_residency_homes_follow_the_memory_plan():
    """Where each component waits and works on a GPU, per placement, as the loader and the stages place
    them (the CPU keeps everything in one place)."""
    from types import SimpleNamespace

    from vidgen.residency import ROLES, STAGES, Residency

    def plan(placement, text="device"):
        return SimpleNamespace(swaps=placement == "swap_experts", streams=placement == "stream_blocks",
                               shards=placement == "shard_blocks", parks_vae=placement != "resident",
                               text_on_cpu=text == "cpu")

    def homes(residency, stage):        # transformer, transformer_2, text_encoder, vae, image_encoder
        return [residency.home(role, stage).type for role in ROLES]

    cuda = torch.device("cuda")
    assert homes(Residency(plan("resident"), cuda), "load") == ["cuda", "cuda", "cuda", "cuda", "cpu"]
    assert homes(Residency(plan("swap_experts"), cuda), "load") == ["cuda", "cpu", "cuda", "cpu", "cpu"]
    assert homes(Residency(plan("stream_blocks", "cpu"), cuda), "load") == ["cpu"] * 5
    swap = Residency(plan("swap_experts"), cuda, offload_text=True)     # model.offload_text_encoder
    assert homes(swap, "encode")[2:] == ["cuda"] * 3
    assert homes(swap, "sample") == ["cuda", "cuda", "cpu", "cpu", "cpu"]
    assert homes(swap, "decode") == ["cpu", "cpu", "cpu", "cuda", "cpu"]
    assert {d for s in STAGES for d in homes(Residency(plan("swap_experts"), torch.device("cpu")), s)} == {"cpu"}


def test_latents_files_say_their_space_and_another_is_refused(base_cfg, tmp_path, capsys):
    """vidgen's latents files say they hold model-space latents; one that says otherwise is not
    decoded as if it did (one line, exit 2)."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    from hostile import assert_refused, untouched

    first = vidgen.render(base_cfg(output={"path": str(tmp_path / "a" / "clip.mp4")}))
    with safe_open(str(first.latents_path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    assert meta["space"] == "model" and json.loads(meta["config"])["seed"] == 7
    other = tmp_path / "b" / "clip.latents.safetensors"
    other.parent.mkdir()
    save_file(tensors, str(other), metadata={**meta, "space": "vae"})
    with untouched(tmp_path):
        code = main(["decode", str(other), "-q"])
    assert_refused(code, capsys.readouterr().err, "says its latents are in 'vae' space", "give a file that vidgen wrote")


def test_a_checkpoint_that_moved_resumes_under_its_own_name(base_cfg, tmp_path):
    """Another render took the checkpoint's name first, so this render's files moved to NAME-2: the
    checkpoint says so, and --resume finishes the clip there, bit-identical, leaving the other's file."""
    out = tmp_path / "out"
    sampling = {"steps": 5, "checkpoint_every": 1, "schedule": "wan", "shift": 3.0}
    whole = vidgen.render(base_cfg(sampling=sampling, output={"path": str(tmp_path / "whole.mp4")}))

    def other_then_stop(p):
        if p.stage == "denoise" and p.step == 0:
            (out / "clip-7.resume.safetensors").write_bytes(b"the other render's checkpoint")
        if p.stage == "denoise" and p.step == 3:
            raise KeyboardInterrupt

    cfg = base_cfg(sampling=sampling, output={"path": str(out / "clip-{seed}.mp4")})
    with pytest.raises(KeyboardInterrupt):
        vidgen.render(cfg, callback=other_then_stop)
    assert sorted(p.name for p in out.iterdir()) == ["clip-7-2.resume.safetensors", "clip-7.resume.safetensors"]
    resumed = vidgen.render(cfg, resume=True)
    assert resumed.path == out / "clip-7-2.mp4"
    assert torch.equal(read_latents(whole.latents_path)[0], read_latents(resumed.latents_path)[0])
    assert (out / "clip-7.resume.safetensors").read_bytes() == b"the other render's checkpoint"
    assert not (out / "clip-7-2.resume.safetensors").exists()
