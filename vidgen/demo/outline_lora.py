"""Stage 5 of the demo: a LoRA on the exported demo transformer that draws every shape as an
outline (`python -m vidgen.demo.train lora` / `lora-export`; docs/demo.md). Resumable like the
other stages (vidgen.demo.train's checkpoint helpers)."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import torch

from ..families import wan_name
from .data import make_batch, prompt_for, split
from .training import _finish, _load, _log_step, _noised, _save, _snapshot

log = logging.getLogger("vidgen")

LORA_TARGETS = r"blocks\.\d+\.(attn1|attn2)\.(to_q|to_k|to_v|to_out\.0)|blocks\.\d+\.ffn\.net\.(0\.proj|2)"
"""The demo LoRA's layers: every attention projection and FFN linear of the transformer's blocks."""
OUTLINE_PX = 4.0
"""The demo LoRA's style: shapes drawn as outlines this many pixels wide (vidgen.demo.data.make_clip)."""


def _encode_outlines(run: Path, base: Path, vae, clips_per_combo: int, seed: int) -> torch.Tensor:
    """Latents (normalised as the model folder's VAE config says) of outline clips of every training
    combination, [N, z, F, h, w], and the combination of each; cached in the run folder."""
    from safetensors.torch import load_file, save_file

    path = run / "outline-latents.safetensors"
    if path.is_file():
        saved = load_file(path)
        return saved["latents"], saved["combo"]
    train_combos, _ = split(seed=0)
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    lat, idx = [], []
    t0 = time.perf_counter()
    with torch.no_grad():
        for ci, combo in enumerate(train_combos):
            rng = np.random.default_rng([seed, ci])
            clips, _ = make_batch([combo] * clips_per_combo, rng, outline=OUTLINE_PX)
            lat.append((vae.encode(clips).latent_dist.mode() - mean) / std)
            idx.append(torch.full((clips_per_combo,), ci, dtype=torch.int64))
    latents, combo = torch.cat(lat).contiguous(), torch.cat(idx)
    save_file({"latents": latents, "combo": combo}, path)
    log.info("encoded %d outline clips in %.0f s", len(combo), time.perf_counter() - t0)
    return latents, combo


def train_lora(run: Path, *, base: Path = Path("samples/demo-wan"), minutes: float, rank: int = 8, batch: int = 16,
               lr: float = 1e-3, clips_per_combo: int = 4, seed: int = 0, save_every: int = 100,
               max_steps: int | None = None) -> dict:
    """Stage 5: a LoRA on the exported demo transformer (PEFT, rank `rank`) that draws every shape as
    an outline, with the same flow-matching loss as stage 3; the text encoder and VAE stay frozen.
    Resumable: the adapter, optimiser, step and data RNG are saved every `save_every` steps."""
    import re

    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
    from transformers import AutoTokenizer, UMT5EncoderModel

    from vidgen.prompt import embed_prompts

    from .models import FLOW_SHIFT, MAX_SEQUENCE_LENGTH

    run.mkdir(parents=True, exist_ok=True)
    vae = AutoencoderKLWan.from_pretrained(base / "vae").eval()
    x0_all, combo_of = _encode_outlines(run, base, vae, clips_per_combo, seed)
    tokenizer = AutoTokenizer.from_pretrained(base / "tokenizer")
    text_encoder = UMT5EncoderModel.from_pretrained(base / "text_encoder").eval()
    transformer = WanTransformer3DModel.from_pretrained(base / "transformer")
    targets = sorted(n for n, _ in transformer.named_modules() if re.fullmatch(LORA_TARGETS, n))
    transformer.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, init_lora_weights=True))
    transformer.train()
    params = [p for n, p in transformer.named_parameters() if "lora_" in n]
    for n, p in transformer.named_parameters():
        p.requires_grad_("lora_" in n)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    train_combos, _ = split(seed=0)
    prompts = [prompt_for(*c) for c in train_combos]
    with torch.no_grad():
        emb_all = embed_prompts(tokenizer, text_encoder, prompts, max_sequence_length=MAX_SEQUENCE_LENGTH,
                                device=torch.device("cpu"), dtype=torch.float32)
    ckpt_path = run / "lora.ckpt"
    state = _load(ckpt_path)
    step, elapsed, rng = 0, 0.0, np.random.default_rng(seed)
    if state is not None:
        set_peft_model_state_dict(transformer, state["lora"])
        opt.load_state_dict(state["optim"])
        step, elapsed = int(state["step"]), float(state["elapsed"])
        rng = np.random.default_rng(state["rng"].numpy().tolist())
        log.info("resuming the lora stage at step %d (%.1f min so far)", step, elapsed / 60)

    def snapshot() -> dict:
        return _snapshot({}, opt, step, elapsed, rng, lora=get_peft_model_state_dict(transformer), rank=rank,
                         targets=json.dumps(targets))

    start, metrics, losses = time.perf_counter(), {}, []
    while (time.perf_counter() - start) < minutes * 60 and (max_steps is None or step < max_steps):
        t0 = time.perf_counter()
        pick = torch.from_numpy(rng.integers(0, len(x0_all), size=batch))
        x0 = x0_all[pick]
        emb = emb_all[combo_of[pick]]
        xt, timesteps, target = _noised(x0, rng, FLOW_SHIFT)
        pred = transformer(xt, timesteps, encoder_hidden_states=emb).sample
        loss = ((pred - target) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        elapsed += time.perf_counter() - t0
        metrics = _log_step("lora", step, loss.item(), losses, t0, metrics)
        if step % save_every == 0:
            _save(ckpt_path, snapshot())
    return _finish(run / "lora.json", ckpt_path, snapshot(), metrics, step, elapsed)


def export_lora(run: Path, out: Path, scale: float = 1.0) -> Path:
    """Write the trained LoRA in the Kijai / ComfyUI layout (`diffusion_model.<Wan name>.lora_down/
    lora_up.weight` + `.alpha`, float32 safetensors), the layout most Wan LoRAs people have use.
    `scale` goes into alpha (alpha = scale * rank): strength 1 of the file is `scale` of the training."""
    from safetensors.torch import save_file

    state = _load(run / "lora.ckpt")
    if state is None:
        raise SystemExit(f"no LoRA checkpoint in {run}: run the `lora` stage first")
    out_sd = {}
    for key, t in state["lora"].items():
        module, part = key.rsplit(".lora_", 1)
        wan = "diffusion_model." + wan_name("transformer", module)
        kind = {"A.weight": "lora_down.weight", "B.weight": "lora_up.weight"}[part]
        out_sd[f"{wan}.{kind}"] = t.float().contiguous()
        out_sd[f"{wan}.alpha"] = torch.tensor(float(state["rank"]) * scale)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.partial")
    save_file(out_sd, str(tmp), metadata={"vidgen": "demo outline LoRA", "rank": str(state["rank"]),
                                           "steps": str(state["step"]), "scale": str(scale)})
    os.replace(tmp, out)
    return out
