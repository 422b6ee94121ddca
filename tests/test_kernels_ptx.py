"""The Triton kernels as a GPU would run them: compiled here for an H100/H200 (sm_90) without one.

The interpreter tests (test_kernels.py) run the kernels' logic with numpy's arithmetic. Bit-equality
with the twins on a GPU also needs the compiled code to keep every float32 step as written: no fused
multiply-add (launches pass enable_fp_fusion=False), no approximate division, square root or exp,
no flush-to-zero on the arithmetic. Triton compiles to PTX and cubin with its own bundled ptxas, so
this checks the instructions a GPU would execute, on the CPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")
pytestmark = pytest.mark.slow      # a compile for sm_90 in a child process per kernel

ROOT = Path(__file__).resolve().parent.parent

# Compiled in a child process: under TRITON_INTERPRET=1 (set by conftest.py on machines without
# CUDA) @triton.jit gives interpreter functions, which cannot be compiled.
_SCRIPT = r"""
import importlib.util, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

spec = importlib.util.spec_from_file_location("vae_ops", sys.argv[1])
k = importlib.util.module_from_spec(spec)
spec.loader.exec_module(k)
I64 = "i64"
strides = lambda names: {n: I64 for n in names.split()}
out = {}
for dtype in ("fp32", "bf16", "fp16"):
    for silu in (True, False):
        sig = {"x_ptr": "*" + dtype, "g_ptr": "*" + dtype, "out_ptr": "*" + dtype, "n_loc": I64, "C": "i32",
               "T": "i32", "H": "i32", "W": "i32", **strides("sxn sxc sxt sxh sxw son soc sot soh sow"),
               "eps": "fp32", "scale": "fp32", "SILU": "constexpr", "BLOCK": "constexpr"}
        src = ASTSource(fn=k._rms_norm_silu_kernel, signature=sig, constexprs={"SILU": silu, "BLOCK": k.BLOCK})
        out[f"rms_norm_silu {dtype} silu={silu}"] = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                                                  options=dict(k._OPTS)).asm["ptx"]
    sig = {"y_ptr": "*" + dtype, "x_ptr": "*" + dtype, "numel": I64, **{n: "i32" for n in "Co Ty Hy Wy ft fs repeats t_skip".split()},
           **strides("syn syc syt syh syw sxn sxc sxt sxh sxw"), "BLOCK": "constexpr"}
    src = ASTSource(fn=k._dup_up_add_kernel, signature=sig, constexprs={"BLOCK": k.BLOCK})
    out[f"dup_up_add {dtype}"] = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(k._OPTS)).asm["ptx"]
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def ptx() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _SCRIPT, str(ROOT / "kernels/triton/vae_ops.py")],
                         capture_output=True, text=True, env=env, timeout=300)
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        if "ptxas" in run.stderr or "Could not find" in run.stderr:
            pytest.skip(f"Triton cannot compile for sm_90 here (its ptxas is missing): {last}")
        pytest.fail(f"compiling the Triton kernels for sm_90 failed: {last}\n{run.stderr[-3000:]}")
    return json.loads(run.stdout)


def _float_ops(code: str) -> set[str]:
    return set(re.findall(r"\b((?:fma|mul|add|sub|div|sqrt|ex2|lg2|rcp|rsqrt|max|min|cvt)\.[a-z0-9.]*f(?:16|32)[a-z0-9.]*)", code))


def test_every_kernel_compiled(ptx):
    assert len(ptx) == 9 and all(".entry" in code for code in ptx.values())


def test_float32_steps_stay_as_written(ptx):
    for name, code in ptx.items():
        ops = _float_ops(code)
        assert not [o for o in ops if o.startswith("fma")], (name, "fused multiply-add")
        assert not [o for o in ops if "approx" in o or o.startswith(("ex2", "lg2", "rcp", "rsqrt"))], (name, ops)
        assert not [o for o in ops if o.startswith(("mul", "add", "sub", "div", "sqrt")) and ".ftz" in o], (name, ops)


def test_the_norm_divides_and_takes_roots_correctly_rounded(ptx):
    for name, code in ptx.items():
        if name.startswith("rms_norm_silu"):
            ops = _float_ops(code)
            assert "div.rn.f32" in ops and "sqrt.rn.f32" in ops, (name, sorted(ops))
            assert ("cvt.rmi.ftz.f32.f32" in ops or "cvt.rmi.f32.f32" in ops) == ("silu=True" in name), name
