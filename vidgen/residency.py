"""Where each component of a loaded pipeline lives at each stage: one object, made from the memory plan.

`Residency(memory, device)` answers `home(role, stage)` — for the transformer experts,
the text encoder, the VAE and Wan2.1 I2V's image encoder, at load, while the prompt and image are
encoded, while sampling, and during the decode — and `in_files(role)`: a role the plan keeps in its
safetensors files between turns holds no memory then and is read where its home is when it runs.
It moves the components accordingly (`encoding`, `visit`, the `ExpertSwitch` of `switch`) and
applies the plan's storage and streaming to the loaded weights (`store` at load, `apply` after any
LoRA). The memory plan (vidgen.memory.MemoryPlan) decides; this is the one place that acts on it.

Stages: "load" (once loaded, before sampling), "encode" (prompt and conditioning image), "sample"
(an expert: during its own turn; the others: while the experts sample), "decode".
"""

from __future__ import annotations

import contextlib
import logging

import torch

from .weights import load_weights, stream_blocks, unload_weights

log = logging.getLogger("vidgen")

ROLES = ("transformer", "transformer_2", "text_encoder", "vae", "image_encoder")
EXPERTS = ("transformer", "transformer_2")      # [high-noise (or only), low-noise]
STAGES = ("load", "encode", "sample", "decode")
CPU = torch.device("cpu")
FP8 = torch.float8_e4m3fn
TEXT_FP8_SKIP = ("norm", r"DenseReluDense\.wo$")
"""Text-encoder layers fp8 storage leaves in model.dtype: norms, and T5's feed-forward output, whose
forward casts its input to the weight's dtype (float8 activations)."""


class Residency:
    """The homes of a pipeline's components under one memory plan (None: no plan, everything on `device`).

    Args:
        memory: the chosen vidgen.memory.MemoryPlan, or None.
        device: the device the render computes on.
        offload_text: model.offload_text_encoder — the text encoder back in host memory after it
            encodes on a GPU.
    """

    def __init__(self, memory, device: torch.device, *, offload_text: bool = False):
        self.memory, self.device, self.offload_text = memory, torch.device(device), offload_text

    @property
    def fp8(self) -> bool:
        """The experts' weights stored in float8_e4m3fn (diffusers' layerwise casting)."""
        return self.memory is not None and self.memory.fp8

    @property
    def sharded(self) -> bool:
        """A parallel render's experts, their blocks sharded over the ranks (vidgen.parallel.shard, FSDP2)."""
        return self.memory is not None and self.memory.shards

    @property
    def streamed(self) -> bool:
        """The experts wait in host memory and their blocks stream onto the device (group offload)."""
        return self.memory is not None and self.memory.streams

    @property
    def offload_experts(self) -> bool:
        """Only the active expert on the device, the other in host memory (or its files)."""
        return self.memory is not None and self.memory.swaps

    @property
    def vae_parked(self) -> bool:
        """Outside residency the VAE waits in host memory until it encodes an image or decodes."""
        return self.memory is not None and self.memory.parks_vae

    @property
    def text_on_cpu(self) -> bool:
        """The plan encodes the prompt on the CPU."""
        return self.memory is not None and self.memory.text_on_cpu

    def in_files(self, role: str) -> bool:
        """Whether `role` waits in its files between its turns (an idle expert, the text encoder
        between encodes): loaded as a shell of meta tensors, read when it runs, dropped after."""
        if self.memory is None:
            return False
        if role in EXPERTS:
            return self.memory.expert_in_files
        return role == "text_encoder" and self.memory.text_in_files

    def home(self, role: str, stage: str) -> torch.device:
        """The device `role`'s weights are on at `stage` (for a role in its files: where it is read to
        when it runs). An expert's "sample" home is where it is during its own turn."""
        if role not in ROLES or stage not in STAGES:
            raise ValueError(f"no home for {role!r} at {stage!r} (roles {ROLES}, stages {STAGES})")
        if self.device.type == "cpu":
            return self.device
        if role in EXPERTS:
            if self.streamed or (self.sharded and stage == "load"):    # sharded: read whole, then sharded onto it
                return CPU
            if stage == "decode" and self.offload_experts:
                return CPU              # released: the decode has the device to itself
            if role == "transformer_2" and self.offload_experts and stage != "sample":
                return CPU              # the low-noise expert waits its turn in host memory
            return self.device
        if role == "text_encoder":
            if self.text_on_cpu:
                return CPU
            return CPU if self.offload_text and stage in ("sample", "decode") else self.device
        if role == "vae":
            return CPU if self.vae_parked and stage in ("load", "sample") else self.device
        return self.device if stage == "encode" else CPU       # image_encoder: on the device only to encode

    def store(self, role: str, model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
        """`model` with the plan's storage dtype as it is loaded: float8 storage computed in `dtype` on an
        expert under fp8, and on a text encoder under fp8 that encodes on the render's device, a CPU device
        too (cast in host memory: the model.dtype copy never reaches the device); `model` unchanged otherwise."""
        if not self.fp8:
            return model
        if role in EXPERTS:
            model.enable_layerwise_casting(storage_dtype=FP8, compute_dtype=dtype)
        elif role == "text_encoder" and not self.text_on_cpu:
            from diffusers.hooks import apply_layerwise_casting

            apply_layerwise_casting(model, storage_dtype=FP8, compute_dtype=dtype, skip_modules_pattern=TEXT_FP8_SKIP)
        return model

    def apply(self, components) -> None:
        """The plan's storage dtype and streaming on the loaded experts of `components` (a
        loading.Components), after any LoRA is applied: layerwise casting and group offload wrap the
        weights as they are. diffusers' hooks: `enable_layerwise_casting` stores each linear and conv
        in float8_e4m3fn and casts it to the compute dtype for its forward (norms, embeddings and the
        patch embedding stay); `enable_group_offload` (block level, one block a group, on a CUDA
        stream) moves each block onto the device just before it runs and back after."""
        if self.memory is None:
            return
        if self.fp8:
            for role, model in zip(EXPERTS, components.experts):
                if getattr(model, "is_quantized", False):
                    log.info("a GGUF expert keeps its own quantised storage (fp8 storage applies to the rest)")
                    continue
                if any(p.dtype == FP8 for p in model.parameters()):
                    continue                    # cast as it was read (load_components)
                self.store(role, model, components.dtype)
                if self.home(role, "load") == self.device and not next(model.parameters()).is_meta:
                    model.to(self.device)
            log.info("weights stored in float8_e4m3fn, computed in %s", str(components.dtype).removeprefix("torch."))
        if self.streamed:
            for model in components.experts:
                if not next(model.parameters()).is_meta:    # an expert in its files streams once read (ExpertSwitch)
                    stream_blocks(model, self.device)
            log.info("transformer blocks streamed onto %s one at a time", self.device)

    @contextlib.contextmanager
    def encoding(self, components):
        """The text encoder of `components` where it encodes, for the block; yields that device. Waiting in
        its files: read there in the dtype the shell keeps (float8 under fp8 storage), dropped after.
        Otherwise moved there and back to where it waits while sampling, if those differ."""
        where = self.home("text_encoder", "encode")
        if not self.in_files("text_encoder"):
            with self.visit("text_encoder", components.text_encoder, "encode"):
                yield where
            return
        load_weights(components.text_encoder, components.info.weights_of("text_encoder"), where)
        try:
            yield where
        finally:
            unload_weights(components.text_encoder)
            _empty_cache(where)

    @contextlib.contextmanager
    def visit(self, role: str, module: torch.nn.Module, stage: str, *, when: bool = True):
        """`module` (the `role`'s) at its home for `stage` during the block and back in host memory after,
        when it waits there while sampling (with `when`; otherwise it stays where it is)."""
        there = self.home(role, stage)
        if not when or there == self.home(role, "sample"):
            yield
            return
        module.to(there)
        try:
            yield
        finally:
            module.to(CPU)
            _empty_cache(there)

    def switch(self, models: list[torch.nn.Module], info=None) -> "ExpertSwitch":
        """The switch that puts each expert of `models` in place for its turn; `info` (a loading.ModelInfo)
        gives their weights when the plan keeps idle experts in their files."""
        files = [info.weights_of(n) for n in info.experts] if self.in_files("transformer") else None
        return ExpertSwitch(models, self.device, swap=self.offload_experts, files=files, stream=self.streamed)


class ExpertSwitch:
    """Keeps only the active expert on the device (the others in host memory) when the plan swaps them.

    Experts run in time order (all high-noise steps, then all low-noise ones), so one swap per
    render moves the high-noise expert out and the low-noise one in. Where each expert is comes
    from its parameters, not from memory of the last swap: a warm pipeline's next render starts
    with the low-noise expert on the device.

    With `files` (each expert's weights) the idle expert holds no memory at all: the active one is
    read from its files when its turn comes — onto the device (swap_experts), or with `stream` into
    host memory, whence its blocks stream onto the device (stream_blocks) — and dropped after.
    Made by Residency.switch.
    """

    def __init__(self, experts: list[torch.nn.Module], device: torch.device, *, swap: bool, files=None,
                 stream: bool = False):
        self.files = files
        self.stream = stream and files is not None
        self.experts, self.device, self.swap = experts, device, swap or self.stream

    @staticmethod
    def _on(model: torch.nn.Module) -> torch.device:
        return next(model.parameters()).device

    def activate(self, index: int) -> None:
        """Expert `index` in place for its turn (the others released first, if it was not)."""
        if not self.swap:
            return
        model = self.experts[index]
        where = self._on(model).type
        if (where != "meta") if self.stream else (where == self.device.type):
            return          # already in place (a streamed expert once read from its files)
        self.release()
        if self.files is None:
            model.to(self.device)
            return
        load_weights(model, self.files[index], CPU if self.stream else self.device)
        if self.stream:
            stream_blocks(model, self.device)

    def release(self) -> None:
        """Every expert to host memory, or back to its files (before the decode, which then has the
        device to itself)."""
        if not self.swap:
            return
        for model in self.experts:
            if self.files is not None and self._on(model).type != "meta":
                unload_weights(model)
            elif self.files is None and self._on(model).type != "cpu":
                model.to(CPU)
        _empty_cache(self.device)


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
