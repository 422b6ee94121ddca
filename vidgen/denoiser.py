"""The model side of sampling: one velocity function over Wan's expert(s), and its building from a plan.

Classifier-free guidance and Wan2.2's two-expert switch (high-noise expert while
t >= boundary * 1000, each expert with its own guidance scale) live here, not in the solver.
Image conditioning is applied here too: I2V-A14B concatenates mask + image latents on channels,
TI2V-5B overwrites the first latent frame and gives its tokens timestep 0. A diffusion-forcing
model (SkyReels-V2 DF) takes one timestep per latent frame and its fps embedding's index.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .conditioning import image_condition, image_embeds
from .control import Control, vace_condition
from .errors import NonFiniteOutput
from . import parallel
from .speed import cache_context, reset_step_cache

if TYPE_CHECKING:
    from .residency import ExpertSwitch

log = logging.getLogger("vidgen")


def expert_index(t, boundary_t: float | None) -> int:
    """Which expert steps at timestep t: 0 (high-noise, or the only one) while t >= boundary_t, else 1.
    Wan2.2's rule; boundary_t = boundary * num_train_timesteps, None for one expert."""
    return 0 if boundary_t is None or t >= boundary_t else 1


def expert_split(timesteps: torch.Tensor, boundary_t: float | None) -> tuple[int, int]:
    """(high-noise steps, low-noise steps) of a schedule's timesteps under `expert_index`."""
    high = sum(1 for t in timesteps.tolist() if expert_index(t, boundary_t) == 0)
    return high, len(timesteps) - high


@dataclass
class Expert:
    model: torch.nn.Module
    guidance_scale: float


class WanDenoiser:
    """velocity_fn(latents, t, i) for the sampler (vidgen.sampling.sample).

    Args:
        experts: [high-noise (or only), low-noise] experts.
        boundary_t: switch timestep (boundary * num_train_timesteps), or None for one expert.
        cond, uncond: prompt embeddings [B, L, D] (uncond None disables CFG).
        concat: I2V condition [B, 4 + z, F, H, W] concatenated to the latents on channels.
        first_frame: per-token timesteps (TI2V-5B): (condition latents [B, z, 1, H, W] or None for text
            only, mask [1, 1, F, H, W] that is 0 on the image frame).
        control: VACE (control latents [1, 2z + s*s, R + F, H, W], hint scale [len(vace_layers)]).
        fps_index: diffusion forcing (vidgen.forcing): its fps embedding's index; t is then one timestep
            per latent frame ([F]) and the model runs with enable_diffusion_forcing.
        switch: puts each expert in place for its turn (vidgen.residency), None: they stay where they are.
    """

    def __init__(self, experts: list[Expert], *, boundary_t: float | None, cond: torch.Tensor,
                 uncond: torch.Tensor | None, concat: torch.Tensor | None = None,
                 first_frame: tuple[torch.Tensor, torch.Tensor] | None = None,
                 switch: ExpertSwitch | None = None, sigmas: torch.Tensor | None = None,
                 image_embeds: torch.Tensor | None = None, control: tuple[torch.Tensor, torch.Tensor] | None = None,
                 fps_index: int | None = None):
        self.experts = experts
        self.switch = switch
        self.sigmas = sigmas            # the schedule's: step caches (speed.step_cache) see each step's sigma
        self.boundary_t = boundary_t if len(experts) > 1 else None
        self.cond, self.uncond = cond, uncond
        self.concat = concat
        self.first_frame = first_frame
        # The model's compute dtype (diffusers keeps some modules in float32, so not the first parameter's).
        self.dtype = experts[0].model.dtype
        # Wan2.1 I2V: CLIP image tokens for the image cross-attention, in the dtype the model computes in.
        self.image_embeds = None if image_embeds is None else image_embeds.to(self.dtype)
        # VACE: the control latents and each context block's hint scale, in the model's dtype.
        self.control = None if control is None else {"control_hidden_states": control[0].to(self.dtype),
                                                     "control_hidden_states_scale": control[1].to(self.dtype)}
        rank = parallel.CURRENT                     # CFG-parallel: the branch exchange and this rank's branch
        self.split, self.branch = parallel.cfg_split(), rank.cfg_index if rank is not None else 0
        self.forcing = None if fps_index is None else {"enable_diffusion_forcing": True, "fps": [fps_index] * len(cond)}

    def expert_for(self, t: torch.Tensor) -> Expert:
        return self.experts[expert_index(t, self.boundary_t)]

    def apply_condition(self, latents: torch.Tensor) -> torch.Tensor:
        """The latents with the TI2V image frame written in (identity for other models)."""
        if self.first_frame is None or self.first_frame[0] is None:
            return latents
        condition, mask = self.first_frame
        return (1 - mask) * condition + mask * latents

    def _timestep(self, latents: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.forcing is not None:                                 # one timestep per latent frame
            return t.unsqueeze(0).expand(latents.shape[0], -1)
        if self.first_frame is None:
            return t.expand(latents.shape[0])
        _, mask = self.first_frame                                   # [1, 1, F, H, W]
        per_token = (mask[0, 0, :, ::2, ::2] * t).flatten()          # one timestep per 2x2 patch
        return per_token.unsqueeze(0).expand(latents.shape[0], -1)

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor, t: torch.Tensor, i: int) -> torch.Tensor:
        """The guided velocity at step i of the schedule (timestep t)."""
        index = expert_index(t, self.boundary_t)
        if self.switch is not None:
            self.switch.activate(index)
        expert = self.experts[index]
        x = self.apply_condition(latents)
        if self.concat is not None:
            x = torch.cat([x, self.concat], dim=1)
        x = x.to(self.dtype)
        timestep = self._timestep(latents, t)

        steps = len(self.sigmas) - 1 if self.sigmas is not None else None
        sigma = self.sigmas[i] if self.sigmas is not None else None

        def run(embeds: torch.Tensor, name: str) -> torch.Tensor:
            with cache_context(expert.model, name, step_index=i, num_steps=steps, sigma=sigma):
                extra = {} if self.image_embeds is None else {"encoder_hidden_states_image": self.image_embeds}
                extra |= (self.control or {}) | (self.forcing or {})
                return expert.model(hidden_states=x, timestep=timestep, encoder_hidden_states=embeds,
                                    return_dict=False, **extra)[0]

        guided = self.uncond is not None and expert.guidance_scale > 1.0
        if guided and self.split is not None:       # CFG-parallel: this rank's branch, its partner's the other
            velocity, velocity_uncond = self.split(run(*((self.cond, "cond"), (self.uncond, "uncond"))[self.branch]))
        else:
            velocity = run(self.cond, "cond")
            velocity_uncond = run(self.uncond, "uncond") if guided else None
        if guided:
            velocity = velocity_uncond + expert.guidance_scale * (velocity - velocity_uncond)
        if not bool(torch.isfinite(velocity).all()):     # one reduction: a black or broken video is never written
            raise NonFiniteOutput(f"step {i + 1}: the transformer's output holds NaN or infinite values, so the render "
                                  "stopped before writing anything; this comes from speed settings (an attention "
                                  "backend, fp8 matmuls) or float16 overflow: try speed.attention_backend: auto, "
                                  "speed.fp8_matmul: false, model.dtype: bfloat16")
        return velocity


def build_denoiser(c, residency, plan, embeds: torch.Tensor, latents: torch.Tensor) -> WanDenoiser:
    """Stage 2 of a render (`c`: loading.Components, `plan`: preflight.Plan): the image conditions (the
    VAE on the device for the image's encode) and the velocity function over the experts, each put in
    place for its turn (residency.switch)."""
    with residency.visit("vae", c.vae, "encode", when=plan.image is not None):
        concat, first_frame = image_condition(c.vae, plan, latents)
    clip_tokens = image_embeds(c.image_encoder, plan, residency)       # Wan2.1 I2V only
    control, ctl, cfg = None, plan.control or Control(None, None), plan.config
    if c.info.family.control:      # a VACE model: grey frames and an all-white mask when it has no control
        with residency.visit("vae", c.vae, "encode"):
            hints = vace_condition(c.vae, c.info, ctl, cfg.num_frames, cfg.height, cfg.width, latents.device)
        control = (hints, torch.full((len(c.info.config("transformer")["vace_layers"]),), ctl.scale, device=latents.device))
    forcing = plan.forcing
    if forcing is not None:        # the causal block size the attention masks with (diffusers' _set_ar_attention)
        for model in c.experts:
            model.register_to_config(num_frame_per_block=forcing.block)
    reset_step_cache(c.experts)          # a step cache must not carry state from the last render
    denoiser = WanDenoiser([Expert(m, g) for m, g in zip(c.experts, plan.guidance)], boundary_t=plan.boundary_t,
                           cond=embeds[:1], uncond=embeds[1:] if len(embeds) > 1 else None, concat=concat,
                           first_frame=first_frame, switch=residency.switch(c.experts, c.info),
                           sigmas=None if forcing else plan.schedule.sigmas, image_embeds=clip_tokens, control=control,
                           fps_index=forcing.fps_index if forcing else None)
    if plan.boundary_t is not None:
        high, low = expert_split(plan.schedule.timesteps, plan.boundary_t)
        log.info("experts: %d high-noise steps, then %d low-noise (switch at t=%g)", high, low, plan.boundary_t)
    return denoiser
