"""Wan2.2-Animate (vidgen.animate) against diffusers' WanAnimatePipeline on a tiny random-weight model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vidgen import animate as A
from vidgen.errors import ConfigError
from vidgen.sampling import schedule
from vidgen.tiny import build_tokenizer

SIZE, FACE, STEPS, SEED = 32, 16, 3, 7
PROMPT, NEGATIVE = "a fox walking on the grass", "blurry low quality"


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    """A tiny WanAnimatePipeline: 2 blocks of width 32, a 16x16 motion encoder, a 32x32 CLIP, z16 VAE."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanAnimatePipeline, WanAnimateTransformer3DModel
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel, UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    tokenizer = build_tokenizer(tmp_path_factory.mktemp("animate") / "tokenizer")
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                               num_heads=4, relative_attention_num_buckets=8,
                                               relative_attention_max_distance=32, pad_token_id=0, eos_token_id=1,
                                               decoder_start_token_id=0)).eval()
    gen = torch.Generator().manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                           temperal_downsample=[False, True, True],
                           latents_mean=(torch.randn(16, generator=gen) * 0.1).tolist(),
                           latents_std=(1 + torch.rand(16, generator=gen)).tolist()).eval()
    transformer = WanAnimateTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=36, latent_channels=16,
        out_channels=16, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, image_dim=32, added_kv_proj_dim=32,
        rope_max_seq_len=32, motion_encoder_channel_sizes={"16": 8, "8": 8, "4": 8}, motion_encoder_size=FACE,
        motion_style_dim=16, motion_dim=4, motion_encoder_dim=16, face_encoder_hidden_dim=16,
        face_encoder_num_heads=2, inject_face_latents_blocks=1, motion_encoder_batch_size=4).eval()
    encoder = CLIPVisionModel(CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                               num_attention_heads=2, image_size=32, patch_size=8)).eval()
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        num_train_timesteps=1000, flow_shift=5.0)
    return WanAnimatePipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                              image_processor=processor, image_encoder=encoder, transformer=transformer)


def frames(n: int, size: int, seed: int, mode: str = "RGB") -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    shape = (size, size, 3) if mode == "RGB" else (size, size)
    return [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode) for _ in range(n)]


def masks(n: int) -> list[Image.Image]:
    """A character box moving right, white where the character is generated."""
    out = []
    for i in range(n):
        m = np.zeros((SIZE, SIZE), np.uint8)
        m[8:24, 4 + 2 * i:20 + 2 * i] = 255
        out.append(Image.fromarray(m, "L"))
    return out


def run_both(pipe, *, num_frames: int, segment: int, prev: int, replace: bool, guidance: float):
    image = frames(1, 40, 1)[0].resize((48, 40))          # not the output size: fit-and-fill is exercised
    pose, face = frames(num_frames, SIZE, 2), frames(num_frames, FACE, 3)
    bg = frames(num_frames, SIZE, 4) if replace else None
    mk = masks(num_frames) if replace else None
    captured: list[torch.Tensor] = []

    def keep(p, i, t, kw):
        if i == STEPS - 1:
            captured.append(kw["latents"].clone())
        return {}

    ref = pipe(image=image, pose_video=pose, face_video=face, background_video=bg, mask_video=mk, prompt=PROMPT,
               negative_prompt=NEGATIVE, height=SIZE, width=SIZE, segment_frame_length=segment,
               num_inference_steps=STEPS, mode="replace" if replace else "animate",
               prev_segment_conditioning_frames=prev, guidance_scale=guidance,
               generator=torch.Generator().manual_seed(SEED), output_type="pt",
               callback_on_step_end=keep).frames                 # [B, F, 3, H, W] in [0, 1]

    cond, uncond = pipe.encode_prompt(PROMPT, NEGATIVE, do_classifier_free_guidance=guidance > 1,
                                      max_sequence_length=512)
    segs = A.plan_segments(num_frames, segment, prev)
    pixels = A.prepare_pixels(image, pose, face, segs, height=SIZE, width=SIZE, face_size=FACE,
                              background_video=bg, mask_video=mk)
    tokens = A.clip_image_tokens(pipe.image_encoder, pipe.image_processor, image)
    sched = schedule("unipc", STEPS, None, "diffusers", scheduler_config=dict(pipe.scheduler.config))
    ours = A.animate(pipe.transformer, pipe.vae, sched, pixels, segs, prompt_embeds=cond, image_tokens=tokens,
                     generator=torch.Generator().manual_seed(SEED), negative_prompt_embeds=uncond,
                     guidance_scale=guidance)
    assert len(ours.segment_latents) == len(captured) == segs.num_segments
    assert min(c.abs().max().item() for c in captured) > 0.1      # real trajectories, not zeros
    lat_diff = max((a - b).abs().max().item() for a, b in zip(ours.segment_latents, captured))
    video = (ours.video / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4)
    assert video.shape == ref.shape
    return lat_diff, (video - ref).abs().max().item()


@pytest.mark.parametrize("num_frames, replace, guidance", [
    pytest.param(5, False, 1.0, id="animate-one-segment"),
    pytest.param(5, False, 3.0, id="animate-with-guidance"),
    pytest.param(5, True, 1.0, id="replace"),
    # 8 frames, segments of 5 overlapping by 1: frames 0-4 and 4-8 (the pose video bounced to 9 frames)
    pytest.param(8, False, 1.0, id="two-segments"),
    # 20 frames, segments of 13 overlapping by 5: frames 0-12 and 8-20, five frames carried over
    pytest.param(20, True, 1.0, id="replace-two-segments-five-carried", marks=pytest.mark.slow),
])
def test_matches_diffusers(pipe, num_frames, replace, guidance):
    segment, prev = (13, 5) if num_frames == 20 else (5, 1)
    lat, pix = run_both(pipe, num_frames=num_frames, segment=segment, prev=prev, replace=replace, guidance=guidance)
    assert lat < 1e-5 and pix < 1e-5, (lat, pix)


def test_segment_arithmetic():
    s = A.plan_segments(77 * 3, 77, 5)
    assert (s.stride, s.num_segments, s.num_target_frames) == (72, 4, 293)
    assert [s.window(k) for k in range(2)] == [(0, 77), (72, 149)]
    assert A.plan_segments(5, 5, 1).num_segments == 1
    assert A.pad_frames([1, 2, 3, 4, 5], 10) == [1, 2, 3, 4, 5, 4, 3, 2, 1, 2]


def test_bad_segments_are_refused_all_at_once():
    with pytest.raises(ConfigError) as e:
        A.plan_segments(1, 76, 3)
    assert len(e.value.problems) == 3


def test_conditions_equal_diffusers_bit_for_bit(pipe):
    """Reference, pose and segment-condition latents are exactly WanAnimatePipeline's prepare_* tensors."""
    image, pose, face = frames(1, SIZE, 1)[0], frames(9, SIZE, 2), frames(9, FACE, 3)
    bg, mk = frames(9, SIZE, 4), masks(9)
    segs = A.plan_segments(9, 5, 1)
    px = A.prepare_pixels(image, pose, face, segs, height=SIZE, width=SIZE, face_size=FACE, background_video=bg,
                          mask_video=mk)
    assert torch.equal(A.reference_latents(pipe.vae, px.image), pipe.prepare_reference_image_latents(px.image, 1))
    start, end = segs.window(1)
    assert torch.equal(A.pose_latents(pipe.vae, px.pose[:, :, start:end]),
                       pipe.prepare_pose_latents(px.pose[:, :, start:end], 1))
    prev = torch.rand(1, 3, 1, SIZE, SIZE) * 2 - 1           # the previous segment's last decoded frame
    for k, p in ((0, None), (1, prev)):
        start, end = segs.window(k)
        for bgs, mks, task in ((px.background[:, :, start:end], px.mask[:, :, start:end], "replace"),
                               (None, None, "animate")):
            ours = A.segment_condition(pipe.vae, p, 5, height=SIZE, width=SIZE, num_known=1 if k else 0,
                                       background=bgs, mask=mks)
            ref = pipe.prepare_prev_segment_cond_latents(p, bgs, mks, 1, 5, start, SIZE, SIZE, 1, task)
            assert torch.equal(ours, ref), (k, task)
    assert 0 < px.mask.mean() < 1 and px.mask.unique().numel() == 2


def test_resume_mid_segment_gives_the_uninterrupted_latents(pipe):
    """Stopped inside the second segment (after its first step) and continued from the finished segment's
    latents and the sampler state: every segment's latents and the video equal the uninterrupted run's."""
    import copy

    image, pose, face = frames(1, SIZE, 1)[0], frames(8, SIZE, 2), frames(8, FACE, 3)
    cond, _ = pipe.encode_prompt(PROMPT, None, do_classifier_free_guidance=False, max_sequence_length=512)
    segs = A.plan_segments(8, 5, 1)
    pixels = A.prepare_pixels(image, pose, face, segs, height=SIZE, width=SIZE, face_size=FACE)
    tokens = A.clip_image_tokens(pipe.image_encoder, pipe.image_processor, image)
    sched = schedule("unipc", STEPS, None, "diffusers", scheduler_config=dict(pipe.scheduler.config))
    saved = {}

    def keep(k, report):
        if k == 1 and report.step == 1:
            saved["state"] = copy.deepcopy(report.state)

    def run(**kw):
        return A.animate(pipe.transformer, pipe.vae, sched, pixels, segs, prompt_embeds=cond, image_tokens=tokens,
                         generator=torch.Generator().manual_seed(SEED), **kw)
    whole = run(callback=keep)
    steps: list[tuple[int, int]] = []
    resumed = run(resume=A.AnimateResume(done=[whole.segment_latents[0].clone()], state=saved["state"]),
                  callback=lambda k, report: steps.append((k, report.step)))
    assert steps == [(1, n) for n in range(2, STEPS + 1)]       # segment 0 not sampled again, nor segment 1's step 1
    assert segs.num_segments == 2 and all(torch.equal(a, b) for a, b in zip(whole.segment_latents,
                                                                           resumed.segment_latents))
    assert torch.equal(whole.video, resumed.video)
    fresh = run(resume=A.AnimateResume(done=[whole.segment_latents[0].clone()]))     # at a segment boundary
    assert torch.equal(fresh.segment_latents[1], whole.segment_latents[1])
