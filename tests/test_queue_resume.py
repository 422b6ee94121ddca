"""Where a render starts (vidgen.resume.start_render, start_job): the checkpoint `--resume` continues,
and what earlier attempts of a queue job left at its output's names."""

from __future__ import annotations

import json

import pytest

import vidgen
from vidgen import resume
from vidgen.errors import InputError
from vidgen.presets import load_config

SAMPLING = {"steps": 5, "checkpoint_every": 1, "schedule": "wan", "shift": 3.0}


def _interrupted(base_cfg, tmp_path) -> dict:
    """A render's config, stopped at step 3 with its checkpoint beside the output."""
    def stop(p):
        if p.stage == "denoise" and p.step == 3:
            raise KeyboardInterrupt
    cfg = base_cfg(sampling=SAMPLING, output={"path": str(tmp_path / "out" / "clip.mp4")})
    with pytest.raises(KeyboardInterrupt):
        vidgen.render(cfg, callback=stop)
    return cfg


def test_resume_starts_from_the_checkpoint_asked_for(base_cfg, tmp_path):
    cfg = load_config(_interrupted(base_cfg, tmp_path))
    ckpt = tmp_path / "out" / "clip.resume.safetensors"
    assert resume.start_render(cfg, None) == resume.Start(cfg)
    for source in (True, ckpt):
        start = resume.start_render(cfg, source)
        assert start.state.step == 3 and start.own == (ckpt.absolute(),) and not start.finished
    ckpt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(InputError, match="damaged|cannot read"):        # the output's own: refused, not skipped
        resume.start_render(cfg, True)


def test_a_job_starts_from_what_its_earlier_attempts_left(base_cfg, tmp_path):
    cfg = load_config(_interrupted(base_cfg, tmp_path))
    out, job = tmp_path / "out" / "clip.mp4", {"id": 1, "created": 1.0, "config_digest": "d"}
    start = resume.start_job(cfg, out, job)
    assert start.state.step == 3 and start.own == (resume.resume_path(out),) and not start.finished
    resume.save_latents(resume.latents_path(out), start.state.latents, cfg, "wan2.1-t2v", job)
    side = out.with_name("clip.mp4.json")
    side.write_text(json.dumps({"job": job}))
    start = resume.start_job(cfg, out, job)                 # its sidecar without the video: removed
    assert not side.exists() and start.own == (resume.latents_path(out), resume.resume_path(out))
    assert resume.start_job(cfg, out, {**job, "id": 2}).own == (resume.resume_path(out),)   # another job's latents
    side.write_text(json.dumps({"job": job}))
    out.write_bytes(b"a finished video")
    assert resume.start_job(cfg, out, job).finished
