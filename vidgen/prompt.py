"""Stage 1: prompt text -> UMT5 embeddings, as Wan and diffusers' WanPipeline compute them."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def encoder_ready(components, device: torch.device, move: bool):
    """The text encoder where it encodes, for the block. Waiting in its files (the memory plan's
    idle_text): read onto `device` in the dtype the shell keeps (float8 under fp8 storage), dropped
    after. Otherwise, with `move`, moved onto `device` and back to host memory after."""
    from .weights import load_weights, unload_weights
    from .loading import on_device

    if components.text_file is None:
        with on_device(components.text_encoder, device, move):
            yield
        return
    load_weights(components.text_encoder, components.text_file, device)
    try:
        yield
    finally:
        unload_weights(components.text_encoder)
        if device.type == "cuda":
            torch.cuda.empty_cache()
