"""The model libraries' own output, silenced: vidgen reports progress itself. A leaf module, so that
`vidgen` and `vidgen queue` (vidgen.queue.cli) both call it without importing each other."""

from __future__ import annotations

import logging
import os


def quiet_libraries(load: bool = True) -> None:
    """Silence the libraries' own bars and warnings: vidgen reports progress itself. load=False: only
    what needs no import (for the LIGHT commands)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")     # never reach for a hub, whatever a library tries
    os.environ["DIFFUSERS_GGUF_CUDA_KERNELS"] = "false"     # GGUF: never the Hub-downloaded CUDA kernels
    # torchao (speed.fp8_matmul), which diffusers imports whenever it is installed, warns at import about
    # optional C++ kernels vidgen does not use, and torch about torchao's pytree registrations
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if not load:
        return
    import warnings

    # diffusers' context parallelism (vidgen.parallel) calls a torch collective torch has since renamed
    warnings.filterwarnings("ignore", message=r".*all_gather_tensor.* is deprecated", category=FutureWarning)
    try:
        import diffusers
        import transformers

        diffusers.utils.logging.set_verbosity_error()
        diffusers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except ImportError:
        pass


def libraries(args) -> None:
    """Import and silence the model libraries, once the config has passed its checks."""
    if not args.debug:
        quiet_libraries()
