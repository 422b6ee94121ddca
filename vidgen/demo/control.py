"""Stage 7: a control-conditioned demo (VACE-style), so a grey silhouette pass decides where the object goes.

The demo transformer (samples/demo-wan) becomes diffusers' `WanVACETransformer3DModel` with VACE
blocks at `VACE_LAYERS`: its main blocks keep demo-wan's weights and stay frozen, each VACE block
starts as a copy of the main block it feeds, its proj_in/proj_out start at zero (so at step 0 the
model renders exactly as demo-wan), as VACE was trained. The control is built the way
`WanVACEPipeline` builds it with no mask (generate every pixel): inactive = video * (1 - mask) = 0
and reactive = video, each encoded by the demo VAE and normalised, then the 64-channel folded mask:
[B, 2 * 8 + 64, T, h, w]. Training clips draw the object along random lines and arcs with its
silhouette in mid-grey on black as the control; a fifth of the steps have no control (a zero video,
as the pipeline passes when `video` is None) and a demo-style clip, so plain renders keep working.
Flow matching as the dit stage; latents cached once; resumable; EMA exported.

    python -m vidgen.demo.control train --minutes 30    # runs/demo-control
    python -m vidgen.demo.control export                # samples/demo-wan-control
    python -m vidgen.demo.control sample                # samples/control-path/ (PNG frames)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from copy import deepcopy
from pathlib import Path

import numpy as np
import torch

from .data import AREA_RANGE, BACKGROUNDS, COLOURS, MIN_TRAVEL, Combo, _extent, _sdf, make_batch, prompt_for, split
from .training import _ema, _finish, _log_step, _noised, _publish, _resume, _save, _snapshot

log = logging.getLogger("vidgen.demo")
BASE, RUN, OUT = Path("samples/demo-wan"), Path("runs/demo-control"), Path("samples/demo-wan-control")
SAMPLE = Path("samples/control-path")
VACE_LAYERS = [0, 2]
# The silhouette's grey (0-255) on a black control frame.
CONTROL_GREY = 128
# Latent geometry of the demo VAE: 4x in time, 8x in space.
TEMPORAL, SPATIAL = 4, 8


def _path(kind: str, rng: np.random.Generator, frames: int, size: int, half: float) -> np.ndarray:
    """Centre (x, y) per frame [F, 2]: a straight line between two random points, or a circular arc."""
    lo, hi = half, size - half
    if kind == "line":
        for _ in range(100):
            a, b = rng.uniform(lo, hi, 2), rng.uniform(lo, hi, 2)
            if np.hypot(*(b - a)) >= MIN_TRAVEL * size * 1.5:
                break
        return a + (b - a) * np.linspace(0.0, 1.0, frames)[:, None]
    radius = rng.uniform(0.12, 0.5) * (hi - lo)
    centre = rng.uniform(lo + radius, hi - radius, 2)
    sweep = rng.choice([-1.0, 1.0]) * rng.uniform(0.6, 2.0) * np.pi
    angle = rng.uniform(0, 2 * np.pi) + sweep * np.linspace(0.0, 1.0, frames)
    return centre + radius * np.stack([np.cos(angle), np.sin(angle)], 1)


def draw(shape: str, centres: np.ndarray, area: float, size: int) -> np.ndarray:
    """Antialiased coverage [F, H, W] of `shape` (of `area` px) centred at each frame's (x, y)."""
    w, _ = _extent(shape, area)
    coords = np.arange(size, dtype=np.float32) + 0.5
    dx = coords[None, None, :] - centres[:, 0, None, None].astype(np.float32)
    dy = coords[None, :, None] - centres[:, 1, None, None].astype(np.float32)
    return np.clip(0.5 - _sdf(shape, dx, dy, w), 0.0, 1.0)


def make_pair(combo: Combo, rng: np.random.Generator, size: int = 64, frames: int = 17,
              kind: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(target uint8 [F, H, W, 3], control uint8 [F, H, W, 3], path [F, 2]): the object on the prompt's
    background along a random path (whatever the prompt's motion word says), and its grey silhouette."""
    combo = Combo(*combo)
    area = rng.uniform(*AREA_RANGE) * size * size
    w, h = _extent(combo.shape, area)
    kind = kind or ("line" if rng.random() < 0.5 else "arc")
    centres = _path(kind, rng, frames, size, 0.5 * max(w, h) * 0.85)
    alpha = draw(combo.shape, centres, area, size)[..., None]
    bg, fg = np.asarray(BACKGROUNDS[combo.background], np.float32), np.asarray(COLOURS[combo.colour], np.float32)
    target = np.rint(bg + alpha * (fg - bg)).astype(np.uint8)
    control = np.rint(np.repeat(alpha * CONTROL_GREY, 3, -1)).astype(np.uint8)
    return target, control, centres


def to_video(clips: np.ndarray) -> torch.Tensor:
    """uint8 [B, F, H, W, 3] -> float [B, 3, F, H, W] in [-1, 1] (the pipeline's preprocess_video range)."""
    return torch.from_numpy(clips).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0


def fold_mask(mask: torch.Tensor) -> torch.Tensor:
    """WanVACEPipeline.prepare_masks for a batch without reference images: [B, F, H, W] in {0, 1} ->
    [B, 64, T, h, w], each 8x8 pixel block folded into channels, frames picked nearest-exact."""
    b, f, hh, ww = mask.shape
    t = (f + TEMPORAL - 1) // TEMPORAL
    m = mask.view(b, f, hh // SPATIAL, SPATIAL, ww // SPATIAL, SPATIAL).permute(0, 3, 5, 1, 2, 4)
    m = m.flatten(1, 2)
    return torch.nn.functional.interpolate(m, size=(t, hh // SPATIAL, ww // SPATIAL), mode="nearest-exact")


def _stats(vae) -> tuple[torch.Tensor, torch.Tensor]:
    z = vae.config.z_dim
    return (torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1),
            torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1))


@torch.no_grad()
def encode(vae, video: torch.Tensor) -> torch.Tensor:
    """Normalised latents (posterior mode), as prepare_video_latents computes them."""
    mean, std = _stats(vae)
    return (vae.encode(video).latent_dist.mode().float() - mean) * (1.0 / std)


@torch.no_grad()
def control_states(vae, video: torch.Tensor | None, frames: int = 17, size: int = 64) -> torch.Tensor:
    """control_hidden_states [B, 80, T, h, w] for a control video [B, 3, F, H, W] in [-1, 1] (None = no
    control: a zero video, as WanVACEPipeline uses), every pixel generated (mask of ones)."""
    if video is None:
        video = torch.zeros(1, 3, frames, size, size)
    mask = torch.ones(video.shape[0], 1, *video.shape[2:])
    inactive, reactive = encode(vae, video * (1 - mask)), encode(vae, video * mask)
    return torch.cat([inactive, reactive, fold_mask(mask[:, 0])], 1)


def _cache(run: Path, base: Path, clips_per_combo: int, plain_per_combo: int, seed: int = 7) -> dict:
    """Target latents, control latents (reactive part) and combination of fresh clips, cached: controlled
    clips along random paths, then demo-style clips (motion as the prompt says) for the no-control steps."""
    from diffusers import AutoencoderKLWan
    from safetensors.torch import load_file, save_file

    path = run / "latents.safetensors"
    if path.is_file():
        return load_file(path)
    vae = AutoencoderKLWan.from_pretrained(base / "vae").eval()
    combos, _ = split(seed=0)
    x0, ctrl, idx, plain = [], [], [], []
    t0 = time.perf_counter()
    for ci, combo in enumerate(combos):
        rng = np.random.default_rng([seed, ci])
        pairs = [make_pair(combo, rng) for _ in range(clips_per_combo)]
        x0.append(encode(vae, to_video(np.stack([p[0] for p in pairs]))))
        ctrl.append(encode(vae, to_video(np.stack([p[1] for p in pairs]))))
        clips, _ = make_batch([combo] * plain_per_combo, rng)
        x0.append(encode(vae, clips))
        idx.append(torch.full((clips_per_combo + plain_per_combo,), ci, dtype=torch.int64))
        plain.append(torch.tensor([0] * clips_per_combo + [1] * plain_per_combo, dtype=torch.bool))
        if ci % 16 == 0:
            log.info("latents: %d of %d combinations (%.0f s)", ci + 1, len(combos), time.perf_counter() - t0)
    empty = control_states(vae, None)[0]
    cache = {"latents": torch.cat(x0).contiguous(), "control": torch.cat(ctrl).contiguous(),
             "combo": torch.cat(idx), "plain": torch.cat(plain), "empty": empty.contiguous()}
    run.mkdir(parents=True, exist_ok=True)
    save_file(cache, path)
    return cache


def build_vace(base: Path, layers: list[int] = VACE_LAYERS):
    """demo-wan's transformer as a WanVACETransformer3DModel: main blocks loaded, VACE blocks copied
    from the blocks they feed, proj_in/proj_out zero (the model starts out rendering as demo-wan)."""
    from diffusers import WanTransformer3DModel, WanVACETransformer3DModel

    src = WanTransformer3DModel.from_pretrained(base / "transformer")
    config = {k: v for k, v in src.config.items() if not k.startswith("_")}
    z = int(config["in_channels"])
    model = WanVACETransformer3DModel(**config, vace_layers=list(layers),
                                      vace_in_channels=2 * z + SPATIAL * SPATIAL)
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    if unexpected or any(not k.startswith("vace_") for k in missing):
        raise RuntimeError(f"demo-wan's transformer does not fit the VACE model: {unexpected or missing}")
    with torch.no_grad():
        for block, layer in zip(model.vace_blocks, layers):
            block.load_state_dict(src.blocks[layer].state_dict(), strict=False)
            for proj in (block.proj_in, block.proj_out):
                if proj is not None:
                    proj.weight.zero_()
                    proj.bias.zero_()
    return model


def _trainable(model) -> list[torch.nn.Parameter]:
    """The VACE parameters (blocks and patch embedding); the main transformer stays frozen."""
    out = []
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("vace_"))
        if p.requires_grad:
            out.append(p)
    return out


def train(run: Path = RUN, base: Path = BASE, *, minutes: float, batch: int = 32, lr: float = 5e-4,
          warmup: int = 100, clips_per_combo: int = 12, plain_per_combo: int = 4, uncontrolled: float = 0.2,
          drop_prompt: float = 0.1, ema_decay: float = 0.999, seed: int = 0, save_every: int = 200) -> dict:
    from transformers import AutoTokenizer, UMT5EncoderModel

    from vidgen.prompt import embed_prompts

    from .models import FLOW_SHIFT, MAX_SEQUENCE_LENGTH

    cache = _cache(run, base, clips_per_combo, plain_per_combo)
    x0_all, ctrl_all, plain = cache["latents"], cache["control"], cache["plain"]
    combo_of, empty = cache["combo"], cache["empty"]
    controlled_idx, plain_idx = torch.nonzero(~plain)[:, 0], torch.nonzero(plain)[:, 0]
    ctrl_of = torch.full((len(plain),), -1, dtype=torch.int64)
    ctrl_of[controlled_idx] = torch.arange(len(controlled_idx))
    combos, _ = split(seed=0)
    tokenizer = AutoTokenizer.from_pretrained(base / "tokenizer")
    text_encoder = UMT5EncoderModel.from_pretrained(base / "text_encoder").eval()
    with torch.no_grad():       # the text encoder stays frozen: each prompt embedded once
        emb_all = embed_prompts(tokenizer, text_encoder, [prompt_for(*c) for c in combos] + [""],
                                max_sequence_length=MAX_SEQUENCE_LENGTH, device=torch.device("cpu"),
                                dtype=torch.float32)
    torch.manual_seed(seed)
    transformer = build_vace(base).train()
    ema = deepcopy(transformer).eval()
    params = _trainable(transformer)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    modules = {"transformer": transformer, "ema_transformer": ema}
    ckpt = run / "control.ckpt"
    step, elapsed, resumed = _resume(ckpt, modules, opt, "control")
    rng = resumed or np.random.default_rng(seed)
    inactive, mask = empty[:8], empty[16:]
    scale = torch.ones(len(VACE_LAYERS))
    start, metrics, losses = time.perf_counter(), {}, []
    while (time.perf_counter() - start) < minutes * 60:
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup)
        free = rng.random(batch) < uncontrolled                              # no control: a demo-style clip
        pick = np.where(free, plain_idx[rng.integers(0, len(plain_idx), batch)].numpy(),
                        controlled_idx[rng.integers(0, len(controlled_idx), batch)].numpy())
        pick = torch.from_numpy(pick)
        x0 = x0_all[pick]
        reactive = torch.where(torch.from_numpy(free).view(-1, 1, 1, 1, 1), empty[8:16].unsqueeze(0),
                               ctrl_all[ctrl_of[pick].clamp(min=0)])
        ctrl = torch.cat([inactive.expand_as(reactive), reactive, mask.expand(batch, *mask.shape)], 1)
        drop = torch.from_numpy(rng.random(batch) < drop_prompt)
        emb = emb_all[torch.where(drop, len(combos), combo_of[pick])]
        xt, timesteps, target = _noised(x0, rng, FLOW_SHIFT)
        pred = transformer(xt, timesteps, encoder_hidden_states=emb, control_hidden_states=ctrl,
                           control_hidden_states_scale=scale).sample
        loss = ((pred - target) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        _ema([(ema, transformer)], step, ema_decay)
        step += 1
        elapsed += time.perf_counter() - t0
        metrics = _log_step("control", step, loss.item(), losses, t0, metrics)
        if step % save_every == 0:
            _save(ckpt, _snapshot(modules, opt, step, elapsed, rng))
    return _finish(run / "control.json", ckpt, _snapshot(modules, opt, step, elapsed, rng), metrics, step, elapsed)


def export(run: Path = RUN, base: Path = BASE, out: Path = OUT) -> Path:
    """A WanVACEPipeline folder: demo-wan's tokenizer, text encoder, VAE and scheduler, and the EMA
    VACE transformer."""
    import shutil

    from diffusers import WanPipeline, WanVACEPipeline

    from .training import _load

    state = _load(run / "control.ckpt")
    if state is None:
        raise SystemExit(f"no checkpoint in {run}: run `train` first")
    model = build_vace(base).eval()
    model.load_state_dict(state["ema_transformer"])
    src = WanPipeline.from_pretrained(base)
    pipe = WanVACEPipeline(tokenizer=src.tokenizer, text_encoder=src.text_encoder, vae=src.vae,
                           scheduler=src.scheduler, transformer=model)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    pipe.save_pretrained(tmp, safe_serialization=True)
    return _publish(tmp, out)


def circle_path(frames: int = 17, size: int = 64, radius: float = 16.0, turns: float = 0.85) -> np.ndarray:
    """The sample's path: most of a circle around the frame centre, clockwise from the left (no prompt
    motion is a curve)."""
    angle = np.pi + 2 * np.pi * turns * np.linspace(0.0, 1.0, frames)
    return size / 2 + radius * np.stack([np.cos(angle), np.sin(angle)], 1)


def write_sample(out: Path = SAMPLE, shape: str = "circle", area_fraction: float = 0.15) -> Path:
    """samples/control-path/: the grey silhouette of `shape` going round circle_path, one PNG a frame."""
    from PIL import Image

    path = circle_path()
    alpha = draw(shape, path, area_fraction * 64 * 64, 64)
    out.mkdir(parents=True, exist_ok=True)
    for i, a in enumerate(alpha):
        grey = np.rint(a * CONTROL_GREY).astype(np.uint8)
        Image.fromarray(np.stack([grey] * 3, -1)).save(out / f"{i:03d}.png")
    return out


def read_control(folder: Path) -> np.ndarray:
    """uint8 [F, H, W, 3] frames of a PNG folder, in name order."""
    from PIL import Image

    return np.stack([np.asarray(Image.open(p).convert("RGB")) for p in sorted(Path(folder).glob("*.png"))])


def centroids(clip: np.ndarray) -> np.ndarray:
    """Object centroid (x, y) per frame [F, 2] of a uint8 clip (NaN where no object): the pixels
    farther than metrics.OBJECT_DISTANCE from the border's median colour, as metrics.measure finds it."""
    from .metrics import MIN_OBJECT_FRACTION, OBJECT_DISTANCE, to_frames

    x = to_frames(clip)
    f, h, w, _ = x.shape
    border = np.concatenate([x[:, :2].reshape(-1, 3), x[:, -2:].reshape(-1, 3),
                             x[:, :, :2].reshape(-1, 3), x[:, :, -2:].reshape(-1, 3)])
    mask = np.linalg.norm(x - np.median(border, axis=0), axis=-1) > OBJECT_DISTANCE
    counts = mask.sum(axis=(1, 2)).astype(np.float64)
    xs, ys = np.arange(w) + 0.5, np.arange(h) + 0.5
    with np.errstate(invalid="ignore", divide="ignore"):
        cx = (mask.sum(1) * xs).sum(1) / counts
        cy = (mask.sum(2) * ys).sum(1) / counts
    out = np.stack([cx, cy], 1)
    out[counts < MIN_OBJECT_FRACTION * h * w] = np.nan
    return out


def path_error(clip: np.ndarray, path: np.ndarray, missing: float = 64.0) -> float:
    """Median over frames of the centroid's distance (px) to the path; a frame without object counts `missing`."""
    d = np.linalg.norm(centroids(clip) - path, axis=1)
    return float(np.median(np.where(np.isnan(d), missing, d)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vidgen.demo.control", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    t = sub.add_parser("train")
    t.add_argument("--run", type=Path, default=RUN)
    t.add_argument("--base", type=Path, default=BASE)
    t.add_argument("--minutes", type=float, default=30.0)
    t.add_argument("--clips-per-combo", type=int, default=12)
    x = sub.add_parser("export")
    x.add_argument("--run", type=Path, default=RUN)
    x.add_argument("--base", type=Path, default=BASE)
    x.add_argument("--out", type=Path, default=OUT)
    s = sub.add_parser("sample")
    s.add_argument("--out", type=Path, default=SAMPLE)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if args.stage == "train":
        print(json.dumps(train(args.run, args.base, minutes=args.minutes, clips_per_combo=args.clips_per_combo)))
    elif args.stage == "export":
        print(f"wrote {export(args.run, args.base, args.out)}")
    else:
        print(f"wrote {write_sample(args.out)}")


if __name__ == "__main__":
    main()
