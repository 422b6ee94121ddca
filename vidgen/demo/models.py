"""The demo model's components: Wan-architecture classes from diffusers/transformers, made narrow.

Every part is the class real Wan2.1 weights load into — `AutoencoderKLWan`, `WanTransformer3DModel`,
`UMT5EncoderModel`, a fast tokenizer, `UniPCMultistepScheduler` in flow mode — so the exported
folder goes through the same loader and pipeline as real weights.
"""

from __future__ import annotations

from pathlib import Path

from .data import BACKGROUNDS, COLOURS, MOTIONS, SHAPES

# The narrow VAE: Wan2.1 layout (4 stages, causal 3D convs, mid attention, 8x spatial and 4x
# temporal compression), base width 16 instead of 96, z_dim 8 instead of 16, one residual block a stage.
VAE_CONFIG = dict(base_dim=16, z_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                  temperal_downsample=[False, True, True], latents_mean=[0.0] * 8, latents_std=[1.0] * 8)

# Text encoder: UMT5 with 2 layers of width 64 (Wan: 24 layers of 4096).
TEXT_CONFIG = dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                   relative_attention_max_distance=16, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                   dropout_rate=0.0)

# Transformer: Wan2.1's block (self-attention with 3D RoPE, cross-attention to the text, FFN,
# AdaLN from the timestep), 4 blocks of width 128 (Wan 1.3B: 30 blocks of 1536).
TRANSFORMER_CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32, in_channels=8,
                          out_channels=8, text_dim=64, freq_dim=64, ffn_dim=256, num_layers=4, cross_attn_norm=True,
                          qk_norm="rms_norm_across_heads", rope_max_seq_len=64)

# The prompts' own words: the template and the vocabulary; anything else tokenizes to <unk>.
WORDS = ("a", "an", "moving", "on", "background", *COLOURS, *SHAPES, *MOTIONS, *BACKGROUNDS)

# Prompts are about 10 tokens; the embedding is padded to this length in training and at render
# time alike (configs/demo.yaml sets model.max_sequence_length to the same value).
MAX_SEQUENCE_LENGTH = 16

# Flow shift of the training timestep distribution and the exported scheduler's default.
FLOW_SHIFT = 3.0


def build_vae(config: dict | None = None):
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(**(config or VAE_CONFIG))


def build_tokenizer(path: Path):
    from vidgen.tiny import build_tokenizer as word_level

    return word_level(path, WORDS)


def build_text_encoder(vocab_size: int, config: dict | None = None):
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(vocab_size=vocab_size, **(config or TEXT_CONFIG)))


def build_transformer(config: dict | None = None):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(**(config or TRANSFORMER_CONFIG))


def build_scheduler(shift: float = FLOW_SHIFT):
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000,
                                   flow_shift=shift)
