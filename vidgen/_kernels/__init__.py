"""vidgen's kernel sources, from the repository's top-level `kernels/` folder.

`kernels/triton` ships as `vidgen._kernels.triton` (Triton kernels: CUDA, or the CPU under
TRITON_INTERPRET=1) and `kernels/metal` as `vidgen._kernels.metal` (Metal shaders for Apple GPUs,
compiled at first use with torch.mps.compile_shader). Nothing here is imported unless its backend
is used (see vidgen.ops).

`kernels/` itself holds no `__init__.py`: from the repository root, `import kernels` must find
Hugging Face's `kernels` distribution (transformers imports it), not our sources
(tests/test_packaging.py).
"""
