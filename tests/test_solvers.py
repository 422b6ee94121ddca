"""Wan-exact flow solvers: schedules and trajectories against numbers from Wan2.2's own schedulers,
diffusers' flow UniPC stepping, expert step counts, and bit-identical interrupt-and-resume (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vidgen.errors import ConfigError
from vidgen.denoiser import expert_split
from vidgen.sampling import SamplerState, sample, schedule

REF = json.loads((Path(__file__).parent / "data" / "wan_solver_reference.json").read_text())
WAN_NAME = {"unipc": "unipc", "dpm++": "dpmpp"}

# A Wan2.1 diffusers folder's scheduler/scheduler_config.json (flow UniPC, shift 3.0 as converted).
DIFFUSERS_CONFIG = {
    "_class_name": "UniPCMultistepScheduler", "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001,
    "disable_corrector": [], "dynamic_thresholding_ratio": 0.995, "final_sigmas_type": "zero", "flow_shift": 3.0,
    "lower_order_final": True, "num_train_timesteps": 1000, "predict_x0": True, "prediction_type": "flow_prediction",
    "rescale_betas_zero_snr": False, "sample_max_value": 1.0, "solver_order": 2, "solver_p": None,
    "solver_type": "bh2", "steps_offset": 0, "thresholding": False, "timestep_spacing": "linspace",
    "trained_betas": None, "use_beta_sigmas": False, "use_exponential_sigmas": False, "use_flow_sigmas": True,
    "use_karras_sigmas": False,
}


def field(x: torch.Tensor, t: torch.Tensor, i: int | None = None) -> torch.Tensor:
    """The analytic velocity field the reference trajectories were computed on (see the fixture)."""
    s = float(t.reshape(-1)[0]) / 1000.0
    return (0.7 - 0.4 * s) * x + 0.5 * torch.tanh(1.3 * x + s) - 0.25 * torch.sin(2.0 * x - 3.0 * s) + 0.1 * s * s


def grid(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """(timesteps, sigmas) of schedule(...)."""
    sched = schedule(*args, **kwargs)
    return sched.timesteps, sched.sigmas


def initial_latents(dtype=torch.float64) -> torch.Tensor:
    return torch.tensor(REF["initial_latents"], dtype=torch.float64).reshape(REF["shape"]).to(dtype)


def case_id(c):
    return f"{c['solver']}-{c['steps']}-{c['shift']}" + (f"-{c['dtype']}" if "dtype" in c else "")


# ------------------------------------------------------------------------------------------ schedules

def test_wan_schedule_reference_values():
    timesteps, sigmas = grid("unipc", 4, 5.0)
    assert timesteps.dtype == torch.int64 and sigmas.dtype == torch.float32
    assert timesteps.tolist() == [999, 937, 833, 624]
    assert torch.equal(sigmas, torch.tensor([0.99979985, 0.93726546, 0.8330554, 0.6246874, 0.0], dtype=torch.float32))


@pytest.mark.parametrize("case", REF["schedules"], ids=case_id)
def test_schedule_equals_wan(case):
    timesteps, sigmas = grid(WAN_NAME[case["solver"]], case["steps"], case["shift"])
    assert timesteps.tolist() == case["timesteps"]
    assert torch.equal(sigmas, torch.tensor(case["sigmas"], dtype=torch.float32))
    assert sigmas[-1].item() == 0.0 and len(sigmas) == case["steps"] + 1


def test_euler_walks_the_unipc_grid():
    assert all(torch.equal(a, b) for a, b in zip(grid("euler", 40, 12.0), grid("unipc", 40, 12.0)))


@pytest.mark.parametrize("case", REF["experts"], ids=lambda c: f"{c['model']}-{c['solver']}")
def test_expert_split_equals_wan(case):
    timesteps, _ = grid(WAN_NAME[case["solver"]], case["steps"], case["shift"])
    assert expert_split(timesteps, case["boundary"] * 1000) == (case["high"], case["low"])


def test_expert_split_a14b_defaults():
    assert expert_split(schedule("unipc", 40, 12.0).timesteps, 875.0) == (26, 14)      # T2V-A14B
    assert expert_split(schedule("unipc", 40, 5.0).timesteps, 900.0) == (15, 25)         # I2V-A14B


# ------------------------------------------------------------------------------------- trajectories

@pytest.mark.parametrize("case", REF["trajectories"], ids=case_id)
def test_trajectory_matches_wan(case):
    dtype = getattr(torch, case["dtype"])
    norms = []
    out = sample(field, initial_latents(dtype), schedule(WAN_NAME[case["solver"]], case["steps"], case["shift"]),
                 callback=lambda r: norms.append(float(r.state.latents.double().norm())))
    assert out.dtype == dtype
    ref = torch.tensor(case["final_latents"], dtype=torch.float64).reshape(out.shape)
    tol = 1e-6 if dtype == torch.float64 else 1e-5
    assert (out.double() - ref).abs().max().item() < tol
    assert max(abs(a - b) for a, b in zip(norms, case["step_norms"])) < tol * 10
    assert len(norms) == case["steps"]


@pytest.mark.parametrize("solver", ["unipc", "dpmpp", "euler"])
def test_each_step_reports_its_denoised_estimate(solver):
    """The step report carries x0 = x - sigma v of the step's model call, in float32 (k-diffusion's
    `denoised`); at the last step (sigma 0 next) it is the result."""
    calls, reports = [], []

    def spy(x, t, i):
        calls.append((x, field(x, t)))
        return calls[-1][1]

    sched = schedule(solver, 6, 5.0)
    out = sample(spy, initial_latents(torch.float32), sched, callback=reports.append)
    assert [(r.step, r.total, int(r.t)) for r in reports] == [(k + 1, 6, int(t)) for k, t in enumerate(sched.timesteps)]
    for r, (x, v), sigma in zip(reports, calls, sched.sigmas):
        assert r.denoised.dtype == torch.float32 and torch.equal(r.denoised, x - sigma * v)
    assert torch.equal(reports[-1].denoised, out)


def test_velocity_fn_gets_wan_timesteps():
    seen = []

    def spy(x, t, i):
        seen.append((t, i))
        return field(x, t)

    sample(spy, initial_latents(), schedule("dpmpp", 5, 5.0))
    assert all(t.dtype == torch.int64 and t.shape == (1,) for t, _ in seen)
    assert [int(t) for t, _ in seen] == schedule("dpmpp", 5, 5.0).timesteps.tolist()
    assert [i for _, i in seen] == [0, 1, 2, 3, 4]      # the step index: t == timesteps[i]
    assert int(seen[0][0]) == 1000                     # Wan's dpm++ grid starts at sigma 1


@pytest.mark.parametrize("solver", ["unipc", "dpmpp", "euler"])
def test_single_point_field_is_exact(solver):
    """v = (x - x0) / sigma is the exact flow to one data point: every solver must land on x0."""
    timesteps, sigmas = grid(solver, 12, 5.0)
    sigma_of = dict(zip(timesteps.tolist(), sigmas.double().tolist()))
    x0 = torch.linspace(-2, 2, 30, dtype=torch.float64).reshape(1, 2, 1, 3, 5)
    noise = initial_latents()[:, :2, :1]
    start = x0 + sigma_of[timesteps[0].item()] * (noise - x0)
    out = sample(lambda x, t, i: (x - x0) / sigma_of[int(t)], start, schedule(solver, 12, 5.0))
    assert (out - x0).abs().max().item() < 1e-12


def test_euler_on_a_linear_field_is_exact():
    """A constant velocity is integrated exactly: x_N = x_0 - sigma_0 * v."""
    v = initial_latents()
    x = torch.zeros_like(v)
    _, sigmas = grid("euler", 40, 12.0)
    out = sample(lambda x, t, i: v, x, schedule("euler", 40, 12.0))
    assert torch.allclose(out, x - sigmas[0].double() * v, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------ diffusers

def run_diffusers(config: dict, steps: int, x: torch.Tensor) -> torch.Tensor:
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler.from_config(config)
    scheduler.set_timesteps(steps, device="cpu")
    for t in scheduler.timesteps:                   # WanPipeline's loop
        x = scheduler.step(field(x, t.expand(x.shape[0])), t, x, return_dict=False)[0]
    return x


@pytest.mark.parametrize("steps,shift", [(30, None), (12, 5.0), (3, 12.0)])
def test_diffusers_schedule_matches_diffusers_unipc(steps, shift):
    config = dict(DIFFUSERS_CONFIG) if shift is None else {**DIFFUSERS_CONFIG, "flow_shift": shift}
    ref = run_diffusers(config, steps, initial_latents())
    out = sample(field, initial_latents(), schedule("unipc", steps, shift, "diffusers",
                                                    scheduler_config=DIFFUSERS_CONFIG))
    assert (out - ref).abs().max().item() < 1e-6


def test_diffusers_grid_differs_from_wan():
    _, wan = grid("unipc", 40, 12.0)
    _, dif = grid("unipc", 40, 12.0, schedule="diffusers")
    assert dif[-1].item() == 0.0 and (wan - dif).abs().max().item() > 1e-3


def test_unsupported_diffusers_config_lists_every_problem():
    bad = {**DIFFUSERS_CONFIG, "solver_order": 3, "solver_type": "bh1"}
    with pytest.raises(ConfigError) as err:
        schedule("unipc", 10, None, schedule="diffusers", scheduler_config=bad)
    assert "solver_order" in str(err.value) and "solver_type" in str(err.value)


def test_bad_arguments_raise_config_error():
    with pytest.raises(ConfigError) as err:
        schedule("heun", 0, -1.0)
    assert len(err.value.problems) == 3


# ------------------------------------------------------------------------------------------- resume

def run_with_states(solver, steps, shift, x, **kw):
    states = {}
    out = sample(field, x, schedule(solver, steps, shift, **kw),
                 callback=lambda r: states.__setitem__(r.step, r.state))
    return out, states


def roundtrip(state: SamplerState, path: Path) -> SamplerState:
    tensors, meta = state.to_tensors()
    save_file(tensors, str(path), metadata={"sampler": json.dumps(meta)})
    from safetensors import safe_open
    with safe_open(str(path), "pt") as f:
        meta_text = f.metadata()["sampler"]
    return SamplerState.from_tensors(load_file(str(path)), meta_text)


@pytest.mark.parametrize("solver", ["unipc", "dpmpp", "euler"])
@pytest.mark.parametrize("grid_name", ["wan", "diffusers"])
def test_interrupt_and_resume_is_bit_identical(solver, grid_name, tmp_path):
    steps, shift = 7, 5.0
    x = initial_latents(torch.float32)
    full, states = run_with_states(solver, steps, shift, x, schedule=grid_name)
    for k in (1, 2, 3, steps - 1, steps):
        resumed = sample(field, None, schedule(solver, steps, shift, grid_name),
                         state=roundtrip(states[k], tmp_path / f"state{k}.safetensors"))
        assert torch.equal(resumed, full), (solver, grid_name, k)


def test_resume_refuses_another_render(tmp_path):
    _, states = run_with_states("unipc", 6, 5.0, initial_latents())
    state = roundtrip(states[3], tmp_path / "s.safetensors")
    for other in [dict(solver="dpmpp", steps=6, shift=5.0), dict(solver="unipc", steps=8, shift=5.0),
                  dict(solver="unipc", steps=6, shift=3.0)]:
        with pytest.raises(ConfigError):
            sample(field, None, schedule(**other), state=state)
    _, states = run_with_states("unipc", 6, None, initial_latents(), schedule="diffusers",
                                scheduler_config=DIFFUSERS_CONFIG)
    with pytest.raises(ConfigError, match="different sigma grid"):
        sample(field, None, schedule("unipc", 6, None, "diffusers", scheduler_config={**DIFFUSERS_CONFIG, "flow_shift": 7.0}),
               state=states[2])


def test_a_resumed_run_passes_the_step_index_of_the_schedule():
    sched = schedule("unipc", 6, 5.0)
    _, states = run_with_states("unipc", 6, 5.0, initial_latents())
    seen = []
    sample(lambda x, t, i: seen.append((int(t), i)) or field(x, t), None, sched, state=states[3])
    assert seen == [(int(sched.timesteps[i]), i) for i in range(3, 6)]
