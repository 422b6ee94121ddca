"""Stage 6: a first-frame-conditioned demo (TI2V-style), so that shots can continue from shots.

The demo transformer (samples/demo-wan) is fine-tuned the way Wan2.2 TI2V-5B conditions on an
image: the first latent frame is given (x_t's first frame is the clean latent, and its tokens get
timestep 0: diffusers' `expand_timesteps`), and the loss is taken on the other frames only. A
fifth of the steps have no given frame, so text-only renders keep working. The text encoder and
the VAE stay as they are; the latents of fresh training clips are cached once. Resumable like the
other stages (`torch.load(weights_only=True)` checkpoints).

    python -m vidgen.demo.first_frame train --minutes 20      # runs/demo-ff
    python -m vidgen.demo.first_frame export                  # samples/demo-wan-i2v
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
from copy import deepcopy
from pathlib import Path

import numpy as np
import torch

from .training import _ema, _finish, _log_step, _noised, _publish, _resume, _save, _snapshot
from .data import make_batch, prompt_for, split

log = logging.getLogger("vidgen.demo")
BASE, RUN, OUT = Path("samples/demo-wan"), Path("runs/demo-ff"), Path("samples/demo-wan-i2v")


def _cache(run: Path, base: Path, clips_per_combo: int, seed: int = 4) -> dict:
    """Normalised latents of fresh training clips, encoded with the base VAE (posterior mean), cached."""
    from diffusers import AutoencoderKLWan
    from safetensors.torch import load_file, save_file

    path = run / "latents.safetensors"
    if path.is_file():
        return load_file(path)
    vae = AutoencoderKLWan.from_pretrained(base / "vae").eval()
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    combos, _ = split(seed=0)
    lat, idx = [], []
    with torch.no_grad():
        for ci, combo in enumerate(combos):
            clips, _ = make_batch([combo] * clips_per_combo, np.random.default_rng([seed, ci]))
            lat.append((vae.encode(clips).latent_dist.mode() - mean) / std)
            idx.append(torch.full((clips_per_combo,), ci, dtype=torch.int64))
    cache = {"latents": torch.cat(lat).contiguous(), "combo": torch.cat(idx)}
    run.mkdir(parents=True, exist_ok=True)
    save_file(cache, path)
    return cache


def train(run: Path = RUN, base: Path = BASE, *, minutes: float, batch: int = 32, lr: float = 2e-4,
          clips_per_combo: int = 16, unconditioned: float = 0.2, ema_decay: float = 0.999, seed: int = 0,
          save_every: int = 200) -> dict:
    from diffusers import WanTransformer3DModel
    from transformers import AutoTokenizer, UMT5EncoderModel

    from vidgen.prompt import embed_prompts

    from .models import FLOW_SHIFT, MAX_SEQUENCE_LENGTH

    cache = _cache(run, base, clips_per_combo)
    x0_all, combo_of = cache["latents"], cache["combo"].tolist()
    combos, _ = split(seed=0)
    tokenizer = AutoTokenizer.from_pretrained(base / "tokenizer")
    text_encoder = UMT5EncoderModel.from_pretrained(base / "text_encoder").eval()
    with torch.no_grad():       # the text encoder stays frozen: each prompt embedded once
        texts = [prompt_for(*c) for c in combos] + [""]
        emb_all = embed_prompts(tokenizer, text_encoder, texts, max_sequence_length=MAX_SEQUENCE_LENGTH,
                                device=torch.device("cpu"), dtype=torch.float32)
    torch.manual_seed(seed)
    transformer = WanTransformer3DModel.from_pretrained(base / "transformer").train()
    ema = deepcopy(transformer).eval()
    opt = torch.optim.AdamW(transformer.parameters(), lr=lr, weight_decay=0.01)
    modules = {"transformer": transformer, "ema_transformer": ema}
    ckpt = run / "ff.ckpt"
    step, elapsed, resumed = _resume(ckpt, modules, opt, "transformer")
    rng = resumed or np.random.default_rng(seed)
    _, _, frames, h, w = x0_all.shape
    per_frame = (h // 2) * (w // 2)
    start, metrics, losses = time.perf_counter(), {}, []
    while (time.perf_counter() - start) < minutes * 60:
        t0 = time.perf_counter()
        pick = rng.integers(0, len(x0_all), size=batch)
        x0 = x0_all[torch.from_numpy(pick)]
        drop = rng.random(batch) < 0.1
        emb = emb_all[torch.tensor([len(combos) if d else combo_of[i] for i, d in zip(pick, drop)])]
        xt, timesteps, target = _noised(x0, rng, FLOW_SHIFT)
        given = torch.from_numpy(rng.random(batch) >= unconditioned)                 # [B]: the first frame given
        xt = torch.where(given.view(-1, 1, 1, 1, 1) & (torch.arange(frames) == 0).view(1, 1, -1, 1, 1), x0, xt)
        per_token = timesteps.view(-1, 1).repeat(1, frames * per_frame)
        per_token[given, :per_frame] = 0
        pred = transformer(xt, per_token, encoder_hidden_states=emb).sample
        err = ((pred - target) ** 2).mean((1, 3, 4))                                 # [B, frames]
        weight = torch.ones_like(err)
        weight[given, 0] = 0                                                         # nothing to learn on a given frame
        loss = (err * weight).sum() / weight.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), 1.0)
        opt.step()
        _ema([(ema, transformer)], step, ema_decay)
        step += 1
        elapsed += time.perf_counter() - t0
        metrics = _log_step("first-frame", step, loss.item(), losses, t0, metrics)
        if step % save_every == 0:
            _save(ckpt, _snapshot(modules, opt, step, elapsed, rng))
    return _finish(run / "ff.json", ckpt, _snapshot(modules, opt, step, elapsed, rng), metrics, step, elapsed)


def export(run: Path = RUN, base: Path = BASE, out: Path = OUT) -> Path:
    """The base folder with the fine-tuned (EMA) transformer and `expand_timesteps: true` in its
    model_index.json: a diffusers WanPipeline that takes a first frame as Wan2.2 TI2V-5B does."""
    from diffusers import WanTransformer3DModel

    from .training import _load

    state = _load(run / "ff.ckpt")
    if state is None:
        raise SystemExit(f"no checkpoint in {run}: run `train` first")
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base, tmp)
    model = WanTransformer3DModel.from_pretrained(base / "transformer")
    model.load_state_dict(state["ema_transformer"])
    shutil.rmtree(tmp / "transformer")
    model.save_pretrained(tmp / "transformer", safe_serialization=True)
    index = json.loads((tmp / "model_index.json").read_text())
    index["expand_timesteps"] = True
    (tmp / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    return _publish(tmp, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vidgen.demo.first_frame", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    t = sub.add_parser("train")
    t.add_argument("--run", type=Path, default=RUN)
    t.add_argument("--base", type=Path, default=BASE)
    t.add_argument("--minutes", type=float, default=20.0)
    t.add_argument("--clips-per-combo", type=int, default=16)
    x = sub.add_parser("export")
    x.add_argument("--run", type=Path, default=RUN)
    x.add_argument("--base", type=Path, default=BASE)
    x.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if args.stage == "train":
        print(json.dumps(train(args.run, args.base, minutes=args.minutes, clips_per_combo=args.clips_per_combo)))
    else:
        print(f"wrote {export(args.run, args.base, args.out)}")


if __name__ == "__main__":
    main()
