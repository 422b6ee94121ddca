"""Tiny random-weight Wan pipelines, built locally, for tests and the smoke preset.

Same classes and folder layout as real Wan weights (diffusers `WanPipeline.save_pretrained`), so
they go through exactly the loader and pipeline that real weights take — only the widths shrink.

    python -m vidgen.tiny samples/tiny-wan                  # Wan2.1-style T2V
    python -m vidgen.tiny /tmp/a14b --variant wan2.2-t2v-a14b
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from diffusers import (AutoencoderKLWan, SkyReelsV2DiffusionForcingPipeline, SkyReelsV2Transformer3DModel,
                       UniPCMultistepScheduler, WanAnimatePipeline, WanAnimateTransformer3DModel,
                       WanImageToVideoPipeline, WanPipeline, WanTransformer3DModel, WanVACEPipeline,
                       WanVACETransformer3DModel)
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import (CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel, PreTrainedTokenizerFast, UMT5Config,
                          UMT5EncoderModel)

from .families import FAMILIES

# A fixed word list so prompts tokenize to real ids; anything else maps to <unk>.
VOCAB_WORDS = (
    "a an the of on in at with and to is are moving running flying walking left right up down "
    "red green blue yellow white black gray orange purple pink brown "
    "circle square triangle ball cube fox cat dog bird fish car boat tree house sun moon star "
    "background sky sea snow grass forest city street night day light dark fast slow big small "
    "blurry low quality static worst jpeg artifacts ugly"
).split()

TINY_FACE = 16
"""The tiny Animate model's face crop size (its motion_encoder_size; the published model's is 512)."""
TINY_VARIANTS = tuple(FAMILIES)     # every registered variant has a tiny twin; the first (Wan2.1 T2V) by default


def build_tokenizer(path: Path, words: tuple[str, ...] | list[str] = VOCAB_WORDS):
    """A word-level fast tokenizer over `words`, saved in the standard files so AutoTokenizer loads it back."""

    specials = ["<pad>", "</s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + list(dict.fromkeys(words)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    # T5-style: every sequence ends with </s>.
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=512)
    fast.save_pretrained(path)
    return fast


def build_tiny_pipeline(path: str | Path, variant: str = TINY_VARIANTS[0], *, seed: int = 0,
                        first_last: bool = False) -> Path:
    """Write a tiny random-weight diffusers-format Wan pipeline folder for `variant` to `path`
    (`first_last`: Wan2.1 I2V in the FLF2V layout, which takes a last frame too)."""

    if variant not in TINY_VARIANTS:
        raise ValueError(f"variant {variant!r}: choose one of {', '.join(TINY_VARIANTS)}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)

    family = FAMILIES[variant]
    z_dim = family.z_dim
    if family.vae == "2.2":  # Wan2.2 VAE layout: z48, residual, patch 2 -> 16x spatial compression
        vae = AutoencoderKLWan(base_dim=8, decoder_base_dim=8, z_dim=z_dim, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                               temperal_downsample=[False, True, True], is_residual=True, in_channels=12,
                               out_channels=12, patch_size=2, scale_factor_spatial=16,
                               latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim)
    else:
        gen = torch.Generator().manual_seed(seed)
        vae = AutoencoderKLWan(base_dim=8, z_dim=z_dim, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                               temperal_downsample=[False, True, True],
                               latents_mean=(torch.randn(z_dim, generator=gen) * 0.1).tolist(),
                               latents_std=(1 + torch.rand(z_dim, generator=gen)).tolist())

    tokenizer = build_tokenizer(path / "tokenizer")
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64,
                                               num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                                               relative_attention_max_distance=32, pad_token_id=0,
                                               eos_token_id=1, decoder_start_token_id=0)).eval()

    in_channels = family.in_channels(z_dim)
    clip_tokens = (32 // 8) ** 2 + 1                    # the tiny CLIP's patches and its class token
    # Wan2.1 I2V: CLIP image tokens through the transformer's image cross-attention; with
    # `first_last`, the FLF2V layout (two images' tokens, a learnt position table for both).
    image_kw = ({"image_dim": 32, "added_kv_proj_dim": 32, "pos_embed_seq_len": 2 * clip_tokens if first_last else None}
                if family.image_encoder else {})

    # VACE: a context block after each of the two blocks, reading the control video's inactive and
    # reactive latents and its mask folded to the latent grid (8 x 8 pixels a latent pixel)
    vace_kw = {"vace_layers": [0, 1], "vace_in_channels": 2 * z_dim + 64} if family.control else {}
    shape = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=in_channels,
                 out_channels=z_dim, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
                 qk_norm="rms_norm_across_heads", rope_max_seq_len=32, **image_kw, **vace_kw)

    # Animate: a 16 x 16 face motion encoder (three stages), its tokens entering after every block
    animate_kw = dict(latent_channels=z_dim, motion_encoder_channel_sizes={"16": 8, "8": 8, "4": 8},
                      motion_encoder_size=TINY_FACE, motion_style_dim=16, motion_dim=4, motion_encoder_dim=16,
                      face_encoder_hidden_dim=16, face_encoder_num_heads=2, inject_face_latents_blocks=1,
                      motion_encoder_batch_size=4)

    def transformer():
        if family.animate:
            return WanAnimateTransformer3DModel(**shape, **animate_kw).eval()
        if family.forcing:     # SkyReels-V2 DF: the fps embedding; one latent frame a causal block, as published
            return SkyReelsV2Transformer3DModel(**shape, inject_sample_info=True, num_frame_per_block=1).eval()
        cls = WanVACETransformer3DModel if family.control else WanTransformer3DModel
        return cls(**shape).eval()

    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        num_train_timesteps=1000, flow_shift=family.flow_shift)
    if family.image_encoder:
        encoder = CLIPVisionModel(CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                                   num_attention_heads=2, image_size=32, patch_size=8)).eval()
        processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        cls = WanAnimatePipeline if family.animate else WanImageToVideoPipeline
        pipe = cls(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae.eval(), scheduler=scheduler,
                   transformer=transformer(), image_encoder=encoder, image_processor=processor)
    elif family.forcing:
        pipe = SkyReelsV2DiffusionForcingPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae.eval(),
                                                  scheduler=scheduler, transformer=transformer())
    elif family.control:
        pipe = WanVACEPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae.eval(), scheduler=scheduler,
                               transformer=transformer(), transformer_2=transformer() if family.experts == 2 else None,
                               boundary_ratio=family.boundary_ratio)
    else:
        pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae.eval(), scheduler=scheduler,
                           transformer=transformer(), transformer_2=transformer() if family.experts == 2 else None,
                           boundary_ratio=family.boundary_ratio, expand_timesteps=family.per_token_timesteps)
    pipe.save_pretrained(path, safe_serialization=True)
    index = json.loads((path / "model_index.json").read_text())
    if index["_class_name"] != family.pipeline_class:  # diffusers names the I2V pipeline class in model_index.json
        index["_class_name"] = family.pipeline_class
        index.setdefault("image_encoder", [None, None])
        index.setdefault("image_processor", [None, None])
        (path / "model_index.json").write_text(json.dumps(index, indent=2))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vidgen.tiny", description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--variant", default=TINY_VARIANTS[0], choices=TINY_VARIANTS)
    parser.add_argument("--seed", type=int, default=0)
    pairs = next(f.name for f in FAMILIES.values() if f.last_frame == "image_pairs")
    parser.add_argument("--first-last", action="store_true", help=f"{pairs} in the FLF2V layout (takes last_image)")
    args = parser.parse_args(argv)
    out = build_tiny_pipeline(args.path, args.variant, seed=args.seed, first_last=args.first_last)
    print(f"wrote tiny {args.variant} pipeline to {out}")


if __name__ == "__main__":
    main()
