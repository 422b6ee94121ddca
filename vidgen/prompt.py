"""Stage 1: prompt text -> UMT5 embeddings, as Wan and diffusers' WanPipeline compute them."""

from __future__ import annotations

import html
import re

import torch


def clean_prompt(text: str) -> str:
    """Fix mojibake (ftfy when installed), unescape HTML entities twice, collapse whitespace."""
    try:
        import ftfy

        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


@torch.no_grad()
def encode_prompts(tokenizer, text_encoder, prompts: list[str], *, max_sequence_length: int,
                   device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Encode prompts; each embedding is cut at its real length and zero-padded to max_sequence_length.

    Returns:
        [B, max_sequence_length, D] in `dtype` on `device`.
    """
    return embed_prompts(tokenizer, text_encoder, prompts, max_sequence_length=max_sequence_length,
                         device=device, dtype=dtype)


def embed_prompts(tokenizer, text_encoder, prompts: list[str], *, max_sequence_length: int,
                  device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """`encode_prompts` with autograd on: the demo model trains its text encoder through it."""
    tokens = tokenizer([clean_prompt(p) for p in prompts], padding="max_length", max_length=max_sequence_length,
                       truncation=True, add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
    mask = tokens.attention_mask
    lengths = mask.gt(0).sum(dim=1)
    encoder_device = next(text_encoder.parameters()).device
    hidden = text_encoder(tokens.input_ids.to(encoder_device), mask.to(encoder_device)).last_hidden_state
    hidden = hidden.to(device=device, dtype=dtype)                                   # [B, L, D]
    # Zero out the padding positions: Wan's model sees exactly the real tokens followed by zeros.
    keep = torch.arange(max_sequence_length, device=device)[None, :] < lengths.to(device)[:, None]
    return torch.where(keep[..., None], hidden, torch.zeros((), dtype=dtype, device=device))


def encode_with(components, residency, prompts: list[str], *, max_sequence_length: int) -> torch.Tensor:
    """`encode_prompts` with the text encoder of `components` (a loading.Components) where `residency` (a
    vidgen.residency.Residency) has it encode: [B, max_sequence_length, D] on the render's device."""
    with residency.encoding(components) as where:       # on the device only while it encodes, or read there
        return encode_prompts(components.tokenizer, components.text_encoder, prompts, device=where,
                              max_sequence_length=max_sequence_length, dtype=components.dtype).to(components.device)
