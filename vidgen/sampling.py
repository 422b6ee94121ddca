"""Stage 3: the denoising loop — integrate the flow from noise to clean latents.

`velocity_fn(x, t)` is the model side (see denoiser.py): it gets the latents and the scheduler's
timestep and returns the flow velocity. The solver side here steps diffusers' flow schedulers
(UniPC, Euler) built from the model folder's scheduler config, so a render with the folder's
settings follows diffusers' WanPipeline step for step.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
StepCallback = Callable[[int, int, torch.Tensor], None]   # (step index, total steps, timestep)


def make_scheduler(solver: str, scheduler_config: dict[str, Any], shift: float | None):
    """A diffusers flow scheduler for `solver` ("unipc" | "euler"), taking the folder's settings.

    shift=None keeps the folder's flow shift.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    base = dict(scheduler_config)
    folder_shift = base.get("flow_shift", base.get("shift", 1.0))
    shift = folder_shift if shift is None else shift
    if solver == "unipc":
        if base.get("_class_name") != "UniPCMultistepScheduler":
            base = {"prediction_type": "flow_prediction", "use_flow_sigmas": True,
                    "num_train_timesteps": base.get("num_train_timesteps", 1000)}
        return UniPCMultistepScheduler.from_config({**base, "flow_shift": shift})
    if solver == "euler":
        return FlowMatchEulerDiscreteScheduler(num_train_timesteps=base.get("num_train_timesteps", 1000), shift=shift)
    raise ValueError(f"unknown solver {solver!r}")


@torch.no_grad()
def sample(velocity_fn: VelocityFn, latents: torch.Tensor, scheduler, *, steps: int,
           callback: StepCallback | None = None) -> torch.Tensor:
    """Integrate from noise `latents` [B, C, F, H, W] (float32) over `steps` scheduler steps.

    Returns:
        Denoised latents, same shape and dtype.
    """
    scheduler.set_timesteps(steps, device=latents.device)
    scheduler.set_begin_index(0)
    timesteps = scheduler.timesteps
    for i, t in enumerate(timesteps):
        velocity = velocity_fn(latents, t)
        latents = scheduler.step(velocity, t, latents, return_dict=False)[0]
        if callback is not None:
            callback(i, len(timesteps), t)
    return latents
