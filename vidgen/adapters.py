"""The LoRAs a loaded pipeline's experts carry, and the swap between renders: a warm pipeline (the
queue's worker, `Pipeline.generate`) takes off what the last render applied and puts on what the
next asks for, or changes nothing when the next asks for the same. Fused weights are read back from
the model files, adapters unloaded, so the experts are bit-identical to a fresh load between LoRA
sets; a swap that fails leaves them as they were, or with no LoRA, or marks them broken.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from . import lora

if TYPE_CHECKING:
    from .loading import Components
    from .preflight import Plan

log = logging.getLogger("vidgen")


class AppliedLoras:
    """What one pipeline's experts carry now (`now`: (mode, per-expert LoRA records), or ())."""

    def __init__(self, components: "Components"):
        self.components = components
        self.now: tuple = ()
        self._fused: list[list[str]] = [[] for _ in components.experts]   # parameters changed, per expert
        self.broken = False             # a failed swap left the experts in an unknown state

    def apply(self, plan: Plan, auto: str = "adapter") -> None:
        """Apply `plan`'s LoRAs (lora_mode auto -> `auto`), taking off what the last render applied:
        fused weights are read back from the model files, adapters unloaded, so the experts are
        bit-identical to a fresh load before the new LoRAs go on.

        Every file is read and checked for every expert first: a list that fails there leaves the
        experts exactly as they were. A failure while applying (out of memory, a PEFT error, a fused
        weight beyond its dtype) takes every LoRA off again (the experts as freshly loaded, `now`
        empty); if even that fails, `broken` is set and a Renderer loads a fresh pipeline."""
        mode = plan.config.lora_mode if plan.config.lora_mode != "auto" else auto
        if any(getattr(m, "is_quantized", False) for m in self.components.experts):
            mode = "adapter"            # GGUF weights cannot take a fused delta (preflight refuses lora_mode: fuse)
        want = (mode, tuple(tuple(p.record for p in plans) for plans in plan.loras)) if plan.loras else ()
        if want == self.now:
            return
        t0 = time.perf_counter()
        experts = self.components.experts
        staged = [lora.stage(list(plans), next(m.parameters()).dtype) if plans else []
                  for m, plans in zip(experts, plan.loras or [()] * len(experts))]   # raises with nothing changed
        try:
            if self._strengths_only(want, plan):
                lora.warn_large(experts, staged)
                self.now = want
                log.info("LoRA strengths: %s in %.2f s", ", ".join(f"{p.path.name} x{p.strength:g}" for p in lora.unique(plan.loras)),
                         time.perf_counter() - t0)
                return
            self._take_off()
            lora.warn_large(experts, staged)
            for e, model in enumerate(experts):
                if staged[e] and mode == "fuse":
                    lora.fuse(model, staged[e], self._fused[e])
                elif staged[e]:
                    lora.attach(model, staged[e], [_adapter_name(i) for i in range(len(staged[e]))], self._fused[e])
            self.now = want
        except BaseException:
            try:
                self._take_off()
            except BaseException:
                self.broken = True
                log.warning("LoRA: the experts could not be put back after a failed swap; the next render loads the model afresh")
            raise
        if want:
            log.info("LoRA (%s): %s in %.2f s", mode, ", ".join(f"{p.path.name} x{p.strength:g} ({p.expert})"
                                                           for p in lora.unique(plan.loras)), time.perf_counter() - t0)

    def _take_off(self) -> None:
        """Every LoRA off: adapters (and PEFT wrappers) unloaded, fused weights read back from the model files."""
        self.now = ()
        info = self.components.info
        for e, model in enumerate(self.components.experts):
            lora.detach(model)
            if self._fused[e]:
                lora.restore(model, info.weights_of(info.experts[e]), self._fused[e])
                self._fused[e] = []

    def _strengths_only(self, want: tuple, plan: Plan) -> bool:
        """When only the strengths of the attached adapters change: set them (diffusers' set_adapters),
        with no unload, load or recompile. Not with fused deltas, which hold their strength."""
        if not (want and self.now and want[0] == self.now[0] == "adapter") or any(self._fused):
            return False
        strip = lambda per_expert: [[{k: v for k, v in r.items() if k != "strength"} for r in records]  # noqa: E731
                                    for records in per_expert]
        if strip(want[1]) != strip(self.now[1]):
            return False
        for model, plans in zip(self.components.experts, plan.loras):
            names = [(_adapter_name(i), p.strength) for i, p in enumerate(plans) if lora.has_pairs(p)]
            if names:
                model.set_adapters([n for n, _ in names], weights=[w for _, w in names])
        return True


def _adapter_name(i: int) -> str:
    """The PEFT adapter name of an expert's i-th LoRA."""
    return f"lora{i}"
