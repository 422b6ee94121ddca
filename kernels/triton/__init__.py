"""Triton kernels (imported only when the triton backend is chosen)."""
