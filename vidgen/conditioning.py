"""Stage 2: the conditions a render samples under — the conditioning image, resized the way the
config says, and encoded into the form each model family takes.

I2V-A14B and Wan2.1 I2V concatenate a mask and the image's latents (first frame given, and the
`image_frames` after it, the rest zeros; with `last_image` the last frame given too) to the latents
on channels, and Wan2.1 I2V adds its CLIP image tokens for the transformer's image cross-attention.
TI2V-5B writes the image's latents (with the `image_frames`, 4 a latent frame) over the first latent
frames and gives their tokens timestep 0 (a mask). Text-to-video models take no image.
"""

from __future__ import annotations

import logging

import torch

from .vae import encode, normalize

log = logging.getLogger("vidgen")


def prepare_image(image, width: int, height: int, fit: str, resize: str) -> torch.Tensor:
    """PIL image -> [1, 3, H, W] in [-1, 1], fitted as `fit` (RenderConfig.image_fit) says; `resize` is
    the variant's image_fit rule (vidgen.families): "bicubic" or "cover"."""
    import numpy as np
    from PIL import Image

    def to_tensor(im) -> torch.Tensor:
        x = torch.from_numpy(np.asarray(im, dtype=np.uint8).copy()).permute(2, 0, 1).float().div(255)
        return x.sub(0.5).div(0.5)[None]

    if fit == "wan" and resize == "bicubic":               # bicubic on the whole image (no crop)
        return torch.nn.functional.interpolate(to_tensor(image), size=(height, width), mode="bicubic")
    if fit == "wan":                                       # LANCZOS to cover, then centre crop
        iw, ih = image.size
        scale = max(width / iw, height / ih)
        image = image.resize((round(iw * scale), round(ih * scale)), Image.LANCZOS)
        x0, y0 = (image.width - width) // 2, (image.height - height) // 2
        return to_tensor(image.crop((x0, y0, x0 + width, y0 + height)))
    from diffusers.video_processor import VideoProcessor

    iw, ih = image.size
    target = width / height
    if abs(iw / ih - target) > 0.01:
        cw, ch = (round(ih * target), ih) if iw / ih > target else (iw, round(iw / target))
        left, top = (iw - cw) // 2, (ih - ch) // 2
        log.info("image %dx%d centre-cropped to %dx%d to match the %dx%d output", iw, ih, cw, ch, width, height)
        image = image.crop((left, top, left + cw, top + ch))
    return VideoProcessor(vae_scale_factor=8).preprocess(image, height=height, width=width).to(torch.float32)


def initial_latents(plan, device: torch.device) -> torch.Tensor:
    """The seed's noise, drawn on the CPU so a seed gives the same clip on every device (or the resumed
    state's latents), [1, z, R + T, h, w] on `device` (R: VACE's reference images)."""
    cfg, state = plan.config, plan.resume_state
    if state is not None:
        return state.latents.to(device)
    b, z, t, h, w = plan.info.latent_shape(cfg.width, cfg.height, cfg.num_frames)
    shape = (b, z, t + plan.reference_frames, h, w)        # VACE: a leading frame per reference image
    return torch.randn(shape, generator=torch.Generator().manual_seed(plan.seed), dtype=torch.float32).to(device)


def image_condition(vae, plan, latents: torch.Tensor):
    """The image conditions of `plan` (a preflight.Plan) for `latents` [B, z, T, h, w]:
    I2V (concat [B, 4+z, T, h, w], None); TI2V (None, (condition, first-frame mask)); T2V (None, None)."""
    info, cfg = plan.info, plan.config
    _, _, T, h, w = latents.shape

    def fit(image) -> torch.Tensor:                                                   # [1, 3, 1, H, W]
        return prepare_image(image, cfg.width, cfg.height, cfg.image_fit, info.family.image_fit)[:, :, None]
    given = [fit(im) for im in (plan.image, *plan.image_frames)] if plan.image is not None else []
    if info.expand_timesteps:
        mask = torch.ones(1, 1, T, h, w, device=latents.device)
        if plan.image is None:
            return None, (None, mask)
        cond = normalize(vae, encode(vae, torch.cat(given, dim=2)).float()).to(latents.device)  # [1, z, L, h, w]
        known = cond.shape[2]                   # 1 + image_frames / 4: whole latent frames, kept clean
        if known > 1:
            cond = torch.cat([cond, cond.new_zeros(1, cond.shape[1], T - known, h, w)], dim=2)
        mask[:, :, :known] = 0
        return None, (cond, mask)
    if plan.image is None:
        return None, None
    frames = given + [given[0].new_zeros(1, 3, cfg.num_frames - len(given) - (plan.last_image is not None),
                                         cfg.height, cfg.width)]
    if plan.last_image is not None:             # first-last-frame: [first, zeros, last], as diffusers builds it
        frames.append(fit(plan.last_image))
    cond = normalize(vae, encode(vae, torch.cat(frames, dim=2)).float()).to(latents.device)   # [1, z, T, h, w]
    mask = torch.zeros(1, info.vae_scale_temporal, T, h, w, device=latents.device)
    mask[:, :, 0] = 1                                                                          # the given frame is known
    for p in range(1, len(given)):        # image_frames: video frame p sits in latent frame 1 + (p - 1) // 4
        mask[:, (p - 1) % info.vae_scale_temporal, 1 + (p - 1) // info.vae_scale_temporal] = 1
    if plan.last_image is not None:
        mask[:, -1, -1] = 1     # the last latent frame holds 4 video frames: only the last of them is given
    return torch.cat([mask, cond], dim=1).expand(latents.shape[0], -1, -1, -1, -1), None


@torch.no_grad()
def image_embeds(clip, plan, residency) -> torch.Tensor | None:
    """Wan2.1 I2V's image tokens for the transformer's image cross-attention: the penultimate hidden
    states of its CLIP vision model for the image (and `last_image`, as a batch of two, as diffusers
    passes them), [n, tokens, dim] on the render's device (`residency`: a vidgen.residency.Residency,
    which puts the model where it encodes); None for models without an image encoder."""
    if clip is None or plan.image is None:
        return None
    model, processor = clip
    images = [plan.image] + ([plan.last_image] if plan.last_image is not None else [])
    device = residency.device
    with residency.visit("image_encoder", model, "encode"):       # waits in host memory
        pixels = processor(images=images, return_tensors="pt")["pixel_values"].to(device, model.dtype)
        return model(pixel_values=pixels, output_hidden_states=True).hidden_states[-2]
