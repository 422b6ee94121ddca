"""Wan2.2-Animate's memory plan: one segment at a time (vidgen.animate_memory). The device figures are one
segment's, sized by animate.segment_frames, whatever the clip's length (num_frames: the pose video's frame
count, any number); the host keeps the clip's frames. Planned from the shipped JSON of the published folder
(vidgen/variants/wan2.2-animate-14b), nothing downloaded; the segment forward's count on meta tensors is
checked against a real forward of a small Animate transformer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from vidgen.animate_memory import segments_of
from vidgen.cli import main
from vidgen.footprint import BudgetError, animate_activations, image_encoder_bytes, model_spec, transformer_weights
from vidgen.memo import Frozen, Memo
from vidgen.memory import plan_render
from vidgen.presets import load_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
ROOT = Path(__file__).resolve().parents[1]
MEMO = Memo()           # one footprint cache for the module's plans (the weights' meta copies are built once)
GIB = 2**30


def _cfg(*overrides: str, frames: int | None = None):
    """A 1280x720 Animate render planned for a CUDA card from the shipped JSON; `frames`: the pose video's
    frame count, as preflight sets num_frames (any number: the config's own 4k + 1 check is not applied)."""
    cfg = load_config(ROOT / "configs/wan-base.yaml", [
        "prompt=x", "model.variant=wan2.2-animate-14b", "model.path=/nowhere/not-downloaded", "model.device=cuda",
        "size=1280x720", "num_frames=77", "memory.device_budget=24GiB", "memory.host_budget=96GiB", *overrides])
    return replace(cfg, num_frames=frames) if frames is not None else cfg


def _plan(*overrides: str, frames: int | None = None):
    return plan_render(_cfg(*overrides, frames=frames), memo=MEMO).chosen


def _stage(plan, name: str):
    return next(s for s in plan.stages if s.name == name)


STREAMED = ("memory.placement=stream_blocks", "memory.weights=bf16")


def _segment_latents(segment_frames: int = 77) -> int:
    """Bytes of one segment's sampled latents, float32 [1, 16, 1 + T, 90, 160] (720p)."""
    return 16 * (1 + (segment_frames - 1) // 4 + 1) * 90 * 160 * 4


def test_a_segment_forward_counted_on_meta_matches_a_real_forward():
    """footprint.animate_activations (a one-block copy with one face adapter, on meta tensors) against the
    live tensors of a real forward of a small Animate transformer of four blocks and two face adapters: pose
    latents, face crops through the motion encoder in batches, CLIP tokens."""
    from diffusers import WanAnimateTransformer3DModel

    from vidgen.vae.memsim import LiveBytes

    conf = dict(patch_size=[1, 2, 2], num_attention_heads=2, attention_head_dim=32, in_channels=36, latent_channels=16,
                out_channels=16, text_dim=48, freq_dim=32, ffn_dim=128, num_layers=4, image_dim=24,
                added_kv_proj_dim=64, rope_max_seq_len=64, motion_encoder_size=32,
                motion_encoder_channel_sizes={"32": 8, "16": 16, "8": 16, "4": 16}, motion_style_dim=16, motion_dim=4,
                motion_encoder_dim=16, face_encoder_hidden_dim=16, face_encoder_num_heads=2,
                inject_face_latents_blocks=2, motion_encoder_batch_size=4)
    torch.manual_seed(0)
    model = WanAnimateTransformer3DModel.from_config(conf).eval()
    frames, t, h, w = 17, 5, 12, 16
    g = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(1, 36, 1 + t, h, w, generator=g), timestep=torch.tensor([500.0]),
                  encoder_hidden_states=torch.randn(1, 7, 48, generator=g),
                  encoder_hidden_states_image=torch.randn(1, 5, 24, generator=g),
                  pose_hidden_states=torch.randn(1, 16, t, h, w, generator=g),
                  face_pixel_values=torch.randn(1, 3, frames, 32, 32, generator=g), return_dict=False)
    with torch.no_grad():
        model(**inputs)             # warm-up: first-call allocations are not activations
    live = LiveBytes("cpu")
    with live, torch.no_grad():
        model(**inputs)
    counted = animate_activations(Frozen(conf), torch.float32, (1, 16, 1 + t, h, w), 7, (5, 24), frames, "cpu")
    assert live.peak <= counted <= 1.05 * live.peak, (live.peak, counted)


def test_the_shipped_json_sizes_the_published_model():
    """The transformer of 17.27 B parameters (Wan2.1 I2V-14B's and the face adapter, motion and face
    encoders, pose embedding) and the CLIP image encoder, counted on the device while it encodes."""
    cfg = _cfg()
    spec = model_spec(cfg)
    assert Path(spec.source).name == "wan2.2-animate-14b" and spec.image_encoder is not None
    assert transformer_weights(spec.transformer, torch.bfloat16, False, memo=MEMO).params == 17_274_816_884
    plan = _plan(*STREAMED)
    clip = image_encoder_bytes(spec.image_encoder, torch.bfloat16)
    assert clip >= 630_766_080 * 2
    assert _stage(plan, "image encoding").device_weights - _stage(plan, "segment encoding").device_weights == clip


def test_denoising_grows_with_segment_frames_not_with_the_clip():
    """A segment's forward is sized by animate.segment_frames; a 1003-frame clip samples the same segments
    as a 77-frame one, on the same device memory: the finished segments' latents (the resume checkpoint's)
    wait in host memory."""
    short, long = _plan(*STREAMED), _plan(*STREAMED, frames=1003)
    shorter_segments = _plan(*STREAMED, "animate.segment_frames=45")
    assert _stage(shorter_segments, "denoising").device_activations < _stage(short, "denoising").device_activations
    finished = (segments_of(1003, 77, 1) - 1) * _segment_latents()
    assert segments_of(1003, 77, 1) == 14
    for name in ("denoising", "segment encoding"):
        assert _stage(long, name).device_activations == _stage(short, name).device_activations, name
    assert _stage(long, "denoising").host - _stage(short, "denoising").host >= finished
    assert _stage(long, "denoising").device_weights == _stage(short, "denoising").device_weights


def test_the_host_keeps_the_whole_clip():
    """The clip's frames accumulate in host memory: uint8 RGB, and twice that with a 16-bit output."""
    short, long = _plan(*STREAMED), _plan(*STREAMED, frames=1003)
    assert long.host_peak_bytes - short.host_peak_bytes >= (1003 - 77) * 1280 * 720 * 3
    deep = _plan(*STREAMED, "output.codec=h265", "output.pix_fmt=yuv420p10le", frames=1003)
    assert _stage(deep, "decode").host - _stage(long, "decode").host == 1003 * 1280 * 720 * 3


@pytest.mark.parametrize("frames", [2, 78, 100])
def test_any_pose_video_length_plans(frames):
    """Not only 4k + 1: 2 frames is one segment (the 77-frame clip's forward), 78 and 100 two."""
    one = _plan(*STREAMED)
    plan = _plan(*STREAMED, frames=frames)
    assert plan.fits and plan.device_peak_bytes <= 24 * GIB
    more = (segments_of(frames, 77, 1) - 1) * _segment_latents()
    assert segments_of(frames, 77, 1) == (1 if frames == 2 else 2)
    assert _stage(plan, "denoising").device_activations == _stage(one, "denoising").device_activations
    if frames > 77:             # the clip's frames, and the finished segment's latents, in host memory
        assert _stage(plan, "denoising").host - _stage(one, "denoising").host >= more + (frames - 77) * 1280 * 720 * 3


def test_driving_videos_or_not_the_plan_is_a_segments():
    """Without animate.pose_video (vidgen plan before the videos exist) the plan is the same segment's."""
    cfg = _cfg(*STREAMED)
    engaged = replace(cfg, animate=replace(cfg.animate, pose_video="pose.mp4", face_video="face.mp4"))
    assert plan_render(engaged, memo=MEMO).chosen == plan_render(cfg, memo=MEMO).chosen


def test_720p_on_a_24_gib_card():
    """1280x720, 77-frame segments, bf16: the 34.6 GB of weights do not fit a 24 GiB card resident, so the
    blocks stream (bf16, the first candidate that fits); every stage within the budget."""
    plan = _plan()
    assert plan.fits and (plan.placement, plan.weights) == ("stream_blocks", "bf16")
    assert 16 * GIB < plan.device_peak_bytes <= 24 * GIB
    assert [s.name for s in plan.stages] == ["text encoding", "image encoding", "segment encoding", "denoising",
                                              "decode"]
    with pytest.raises(BudgetError, match="below the minimum"):
        _plan("memory.placement=resident", "memory.weights=bf16")


def test_vidgen_plan_without_weights(capsys, monkeypatch):
    """`vidgen plan` for wan2.2-animate-14b with model.path not downloaded: the shipped JSON, at 1280x720."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(ROOT)
    code = main(["plan", "configs/wan-base.yaml", "model.variant=wan2.2-animate-14b", "model.path=/nowhere",
                 "size=1280x720", "num_frames=77", "model.device=cuda", "memory.device_budget=48GiB",
                 "memory.host_budget=96GiB", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    plan = json.loads(out)
    assert plan["fits"] and (plan["placement"], plan["weights"]) == ("resident", "bf16")
    assert [s["name"] for s in plan["stages"]] == ["text encoding", "image encoding", "segment encoding",
                                                   "denoising", "decode"]
