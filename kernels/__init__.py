"""Kernel sources for vidgen's fused ops, installed as `vidgen._kernels`.

triton/: Triton kernels (CUDA; CPU under TRITON_INTERPRET=1). metal/: Metal shaders for Apple
GPUs, compiled at first use with torch.mps.compile_shader. Nothing here is imported unless the
backend is used (see vidgen.ops).
"""
