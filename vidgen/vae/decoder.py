"""Exact, memory-bounded decode for diffusers' AutoencoderKLWan (Wan2.1 z16 and Wan2.2 z48).

The decoder runs on the loaded module's own weights, in two phases:

1. **Whole frame**: post_quant_conv, conv_in and the mid block (whose attention is the only
   non-local op), then the first `tile_from` up blocks, for every latent frame, one frame at a
   time with the temporal cache. The results are kept (on the host for GPU decodes). The low
   stages are cheap to run whole and their halos are the widest, so running them whole saves the
   recompute that tiles would spend on their halos.
2. **Tiles**: everything after the mid block is local. The frame is split into a grid of tiles;
   each tile is decoded from up block `tile_from` on over the whole clip (tile-major) from a
   halo-extended crop of the phase-1 output. The halo shrinks stage by stage to exactly what the
   remaining layers can see, and each tile carries its own temporal cache, so tile borders never
   change a pixel. Frames become final while the last tile runs; they are yielded then.

Memory: no padded copies (conv3d pads H/W itself; the temporal cache and the normalised input
share one buffer), every block takes `frames_per_step` frames at a time, and only one tile's
cache lives at once. The plan (tile grid, frames per step) comes from
plan.py.

The memory-bound work around the convolutions (norm + SiLU into the conv buffer, the cache
hand-over, crops, nearest upsampling, Wan2.2's DupUp3D shortcut) goes through a `VaeOps` table
(vidgen/ops), so the same loop runs on the torch, Triton and Metal backends.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from ..errors import OutputError
from ..ops import VaeOps, op_table


# --------------------------------------------------------------------------------------------
# Convolution


ONEDNN_WEIGHT_SLICE = 32 << 20
"""The most float32 weight bytes one oneDNN convolution call takes on the CPU: oneDNN copies a
call's weights into its blocked layout, so a 1024-channel 3x3x3 conv (108 MiB of weights, Wan2.2's
lower up blocks) would grow resident memory by that much for the call; in output-channel slices it
grows by one slice. Each output channel is the same sum either way (bit-identical results)."""


def onednn_slices(weight: torch.Tensor) -> int:
    """How many output-channel slices conv3d splits a CPU float32 convolution with `weight` into."""
    out = weight.shape[0]
    n = -(-weight.numel() * 4 // ONEDNN_WEIGHT_SLICE)
    while out % n:
        n += 1
    return n


def conv3d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding=(0, 0, 0)) -> torch.Tensor:
    """F.conv3d, stride 1; on the CPU in float32 always through oneDNN, in output-channel slices of at
    most ONEDNN_WEIGHT_SLICE bytes of weights.

    PyTorch's CPU conv3d takes oneDNN only when N*C*D*H > 20480 and otherwise falls back to its
    im2col `slow_conv3d`, which is 2-9x slower on the decoder's shapes: a causal conv on one frame
    (D = 3 with its cache) or a narrow or small tile. oneDNN computes the same convolution in
    another summation order (float32 rounding, ~1e-6 relative).
    """
    if x.device.type == "cpu" and x.dtype == torch.float32 and torch.backends.mkldnn.enabled \
            and torch.backends.mkldnn.is_available() and not isinstance(x, FakeTensor):   # not simulated
        pad, one = list(padding), [1, 1, 1]
        n = onednn_slices(weight)
        if n == 1:
            return torch.mkldnn_convolution(x, weight, bias, pad, one, one, 1)
        k = weight.shape[0] // n
        return torch.cat([torch.mkldnn_convolution(x, weight[i:i + k], None if bias is None else bias[i:i + k],
                                                   pad, one, one, 1)
                          for i in range(0, weight.shape[0], k)], dim=1)
    return F.conv3d(x, weight, bias, padding=padding)


SMALL_CONV_MACS = 1 << 22
"""Below this many multiply-adds per kernel tap (in x out channels x frame pixels), a CPU conv costs
its call more than its arithmetic: oneDNN makes a primitive for each new shape (about 1 ms) and a
one-frame 32-channel 16x16 conv runs in 0.2 ms. The two shortcuts that give a conv a new shape,
the first frame's zero taps and the subpixel upsample, are taken only above it: on the 64x64 demo
they made the decode 0.2 s slower (0.5 -> 0.7 s)."""


def _reshaping_pays(c_in: int, c_out: int, h: int, w: int) -> bool:
    """Whether a conv of c_in -> c_out channels on h x w frames is big enough for a shortcut that
    gives it a new shape (SMALL_CONV_MACS)."""
    return c_in * c_out * h * w >= SMALL_CONV_MACS


# --------------------------------------------------------------------------------------------
# Explicit temporal cache


class TemporalCache:
    """The last two input frames of every causal conv, per conv site (zeros before the clip starts)."""

    def __init__(self, channels_last: bool = False):
        self.frames: dict[str, torch.Tensor] = {}
        # cuDNN's conv3d is several times faster on channels-last (NDHWC) activations on recent
        # GPUs; conv outputs keep the layout of the buffer they are fed.
        self.memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format

    def empty(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        return torch.empty(shape, dtype=like.dtype, device=like.device, memory_format=self.memory_format)

    def get(self, key: str, like: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """([N, C, 2, H, W] cache of `key`, whether it is new): new ones are uninitialised, for
        causal_cache_shift(first=True) fills the conv buffer's head with zeros instead."""
        cached = self.frames.get(key)
        if cached is not None:
            return cached, False
        n, c, _, h, w = like.shape
        cached = self.frames[key] = self.empty((n, c, 2, h, w), like)
        return cached, True


def causal_conv(conv, x: torch.Tensor, cache: TemporalCache, key: str, ops: VaeOps, norm=None) -> torch.Tensor:
    """Wan's causal conv (k_t = 3) over chunk `x` [N, C, T, H, W], optionally fed by RMS norm + SiLU.

    Builds [cache | norm(x)] in one buffer, updates the cache from it, and lets conv3d pad H and W.
    """
    kt = conv.kernel_size[0]
    pw, ph = conv._padding[0], conv._padding[2]
    if kt == 1:
        src = x
        if norm is not None:
            src = cache.empty(x.shape, x)
            ops.rms_norm_silu_into(x, norm.gamma, src)
        return conv3d(src, conv.weight, conv.bias, padding=(0, ph, pw))
    prev, first = cache.get(key, x)
    n, c, t, h, w = x.shape
    buf = cache.empty((n, c, 2 + t, h, w), x)
    if norm is None:
        buf[:, :, 2:] = x
    else:
        ops.rms_norm_silu_into(x, norm.gamma, buf[:, :, 2:])
    ops.causal_cache_shift(buf, prev, first)
    if first and t == 1 and _reshaping_pays(c, conv.out_channels, h, w):
        # A clip's first frame sees only zeros before it (Wan's causal padding): its two earlier taps
        # add nothing, so one tap over one frame gives the same sum at a third of the work. (The tap
        # is copied here, where a simulation counts it, rather than inside cuDNN or oneDNN.)
        out = conv3d(buf[:, :, 2:], conv.weight[:, :, 2:].contiguous(), conv.bias, padding=(0, ph, pw))
    else:
        out = conv3d(buf, conv.weight, conv.bias, padding=(0, ph, pw))
    del buf
    return out


def residual_block(block, x: torch.Tensor, cache: TemporalCache, key: str, ops: VaeOps) -> torch.Tensor:
    """WanResidualBlock: shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))))))."""
    y = causal_conv(block.conv1, x, cache, key + ".conv1", ops, norm=block.norm1)
    y = causal_conv(block.conv2, y, cache, key + ".conv2", ops, norm=block.norm2)
    if isinstance(block.conv_shortcut, torch.nn.Identity):
        return y.add_(x)
    return y.add_(conv3d(x, block.conv_shortcut.weight, block.conv_shortcut.bias))


def resample_up(rs, x: torch.Tensor, cache: TemporalCache, key: str, first_chunk: bool, ops: VaeOps,
                subpixel: bool = False) -> torch.Tensor:
    """WanResample upsample2d / upsample3d: optional causal time conv (x2 frames), then nearest x2 + conv2d
    (`subpixel`: as four 2x2 convs on the small frame, see upsample_conv_subpixel)."""
    n, c, t, h, w = x.shape
    if rs.mode == "upsample3d" and not first_chunk:
        # Wan skips the time conv on the first chunk (its 'Rep' marker) and starts it from zeros.
        y = causal_conv(rs.time_conv, x, cache, key + ".time_conv", ops)   # [N, 2C, T, H, W]
        # its channel halves are frames 2i and 2i+1: read them in place, no interleaved copy
        halves = y.view(n, 2, c, t, h, w)
        frames = [halves[:, i % 2, :, i // 2] for i in range(2 * t)]
    else:
        frames = [x[:, :, i] for i in range(t)]
    conv = rs.resample[1]
    out = cache.empty((n, conv.out_channels, len(frames), 2 * h, 2 * w), x)
    if subpixel and _reshaping_pays(c, conv.out_channels, h, w):
        upsample_conv_subpixel(frames, conv, out)
        return out
    up = cache.empty((n, c, 1, 2 * h, 2 * w), x)   # one frame: the 4x-larger upsample stays small
    for i, frame in enumerate(frames):
        ops.upsample_nearest2x_into(frame.unsqueeze(2), up)
        out[:, :, i] = F.conv2d(up[:, :, 0], conv.weight, conv.bias, padding=conv.padding)
    return out


def _phase_kernel(weight: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """The 2x2 kernel [O, I, 2, 2] a 3x3 conv applies to the small frame at output pixels (2y+a, 2x+b)
    of a nearest x2 upsample: of its three rows, the two that read the same source row add up (rows
    0 | 1+2 for a = 0, 0+1 | 2 for a = 1), and likewise its columns."""
    def fold(w: torch.Tensor, dim: int, phase: int) -> torch.Tensor:
        k0, k1, k2 = w.unbind(dim)
        return torch.stack((k0, k1 + k2) if phase == 0 else (k0 + k1, k2), dim=dim)
    return fold(fold(weight.float(), 2, a), 3, b).to(weight.dtype)     # 16-bit weights: folded in float32


def upsample_conv_subpixel(frames: list[torch.Tensor], conv, out: torch.Tensor) -> None:
    """out[:, :, i] = conv(nearest_x2(frames[i])) for a 3x3, padding-1 conv, computed as four 2x2 convs
    on the small frame, one per output phase: 16 multiply-adds per source pixel and channel pair instead
    of 36, and no 4x-larger upsampled frame. The same sum up to float rounding (the folded weights are
    added before the products); CPU plans in 32-bit floats take it (DecodePlan.subpixel).

    One phase's kernel at a time (4/9 of the weights) is kept, and one zero-bordered source frame."""
    n, c, h, w = frames[0].shape
    padded = frames[0].new_zeros((n, c, h + 2, w + 2))
    for a in (0, 1):
        for b in (0, 1):
            kernel = _phase_kernel(conv.weight, a, b)
            for i, frame in enumerate(frames):
                padded[:, :, 1:h + 1, 1:w + 1] = frame
                # phase (a, b) reads source rows y-1+a, y+a and columns x-1+b, x+b
                out[:, :, i, a::2, b::2] = F.conv2d(padded[:, :, a:a + h + 1, b:b + w + 1], kernel, conv.bias)
            del kernel


# --------------------------------------------------------------------------------------------
# Geometry: halos and tile regions


def up_path_halos(decoder) -> list[int]:
    """Halo (px at each stage's input scale) that each up block needs so its tile interior is exact.

    Returns [halo before up_blocks[0], ..., before up_blocks[-1], before the head]. Each 3x3 conv
    reaches 1 px; nearest x2 upsampling halves a reach (rounded up) after its conv's own 1 px.
    """
    halos = [1]                                   # head: conv_out, 3x3
    for block in reversed(decoder.up_blocks):
        h = halos[0]
        if _upsampler(block) is not None:
            h = math.ceil((h + 1) / 2)
        halos.insert(0, h + 2 * len(block.resnets))
    return halos


def _upsampler(block):
    if getattr(block, "upsamplers", None) is not None:
        return block.upsamplers[0]
    return getattr(block, "upsampler", None)


@dataclass(frozen=True)
class Tile:
    """A tile's core rows/cols in latent pixels: [y0, y1) x [x0, x1)."""

    y0: int
    y1: int
    x0: int
    x1: int


def tile_grid(h: int, w: int, ny: int, nx: int) -> list[Tile]:
    ys = [round(i * h / ny) for i in range(ny + 1)]
    xs = [round(i * w / nx) for i in range(nx + 1)]
    return [Tile(ys[i], ys[i + 1], xs[j], xs[j + 1]) for i in range(ny) for j in range(nx)]


def _region(lo: int, hi: int, scale: int, halo: int, size: int) -> tuple[int, int]:
    return max(0, lo * scale - halo), min(size * scale, hi * scale + halo)


# --------------------------------------------------------------------------------------------
# The decode


@dataclass(frozen=True)
class DecodePlan:
    ny: int = 1
    nx: int = 1
    frames_per_step: int = 4      # frames each up block takes at a time
    mid_on_host: bool = False     # keep phase-1 results in host memory (GPU decodes)
    channels_last: bool = False   # NDHWC activations (GPU decodes)
    tile_from: int = 0            # up blocks before this one run whole-frame in phase 1
    mid_in_file: bool = False     # keep phase-1 results as each tile's crop in a temporary file (CPU
                                  # decodes whose budget cannot also hold them)
    subpixel: bool = False        # upsample convs as four 2x2 convs on the small frame (CPU decodes)

    def describe(self) -> str:
        return (f"{self.ny}x{self.nx} tiles from up block {self.tile_from}, {self.frames_per_step} frames/step"
                + (", phase-1 results in a temporary file" if self.mid_in_file else ""))


class PhaseOneFile:
    """Phase-1 results written out as each tile's halo-extended crop, in an unnamed temporary file.

    A CPU decode whose budget cannot hold the phase-1 results of the whole clip beside a tile's decode
    keeps them here: each latent frame's result is cut into the crops the tiles will read (a crop
    per tile, overlaps written twice) and written as it is made, and each tile reads its crop back
    into one tensor of exactly its shape. The file lives in the page cache, which the kernel can
    drop, not in the process's resident memory; it has no name (removed when closed, or when the
    process dies). `spill_dir=None` uses the temp folder. With `simulate=True` nothing is written:
    the crops are made and dropped, and reads return new empty tensors of the same shapes, so a
    meta-tensor run counts exactly the bytes a real one allocates.
    """

    def __init__(self, regions: list[tuple[int, int, int, int]], spill_dir: str | None = None,
                 simulate: bool = False):
        self.regions = list(dict.fromkeys(regions))        # tiles whose halos reach the same crop share it
        self.index: dict[tuple[int, tuple], tuple[int, torch.Size, torch.dtype, torch.device]] = {}
        self.frames = 0
        self.file = None
        if not simulate:
            import tempfile

            self.where = where = spill_dir or tempfile.gettempdir()
            try:
                self.file = tempfile.TemporaryFile(dir=spill_dir, prefix="vidgen-phase1-", buffering=0)
            except OSError as err:
                raise _spill_error(where, err) from None
            if ram_backed(where):
                logging.getLogger("vidgen").warning(
                    "decode: %s is a RAM-backed file system, so the phase-1 results the plan keeps in a file there "
                    "stay in memory beyond vae.memory_budget; set TMPDIR to a folder on disk", where)

    def __len__(self) -> int:
        return self.frames

    def put(self, x: torch.Tensor) -> None:
        """Write latent frame `len(self)`'s result x [1, C, t, H, W] as every tile's crop."""
        for region in self.regions:
            y0, y1, x0, x1 = region
            crop = x[:, :, :, y0:y1, x0:x1].contiguous()
            offset = 0
            if self.file is not None:
                crop = crop.cpu()
                offset = self.file.seek(0, 2)
                try:
                    self.file.write(crop.view(torch.uint8).numpy())
                except OSError as err:
                    raise _spill_error(self.where, err) from None
            self.index[self.frames, region] = (offset, crop.shape, crop.dtype, crop.device)
            del crop
        self.frames += 1

    def read(self, i: int, region: tuple[int, int, int, int]) -> torch.Tensor:
        """Latent frame i's crop `region` (y0, y1, x0, x1), as one new tensor."""
        offset, shape, dtype, device = self.index[i, region]
        out = torch.empty(shape, dtype=dtype, device=device)
        if self.file is not None:
            view, done = out.view(torch.uint8).numpy().reshape(-1), 0
            try:
                self.file.seek(offset)
                while done < view.size:
                    n = self.file.readinto(view[done:])
                    if not n:
                        raise OSError(f"it ended early, at byte {offset + done}")
                    done += n
            except OSError as err:
                raise _spill_error(self.where, err) from None
        return out

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def ram_backed(path: str) -> bool:
    """Whether `path` lies on a file system kept in memory (tmpfs, ramfs), by /proc/mounts (Linux;
    False elsewhere)."""
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split()[1:3] for line in f]
    except OSError:
        return False
    real = os.path.realpath(path)
    inside = [(point, kind) for point, kind in mounts
              if real == point or real.startswith(point.rstrip("/") + "/")]
    return bool(inside) and max(inside, key=lambda m: len(m[0]))[1] in ("tmpfs", "ramfs")


def _spill_error(where: str, err: OSError) -> OutputError:
    return OutputError(f"cannot keep the decode's phase-1 results in a temporary file in {where}: "
                       f"{err.strerror or err}; free space there, set TMPDIR, or raise vae.memory_budget")


class WanStreamingDecoder:
    """Decode de-normalised latents of one clip tile by tile; see the module docstring."""

    def __init__(self, vae, ops: VaeOps, subpixel: bool = False):
        self.vae = vae
        self.ops = ops
        self.subpixel = subpixel
        self.decoder = vae.decoder
        self.patch = vae.config.patch_size or 1
        self.halos = up_path_halos(self.decoder)
        self.scales = [1]
        for block in self.decoder.up_blocks:
            self.scales.append(self.scales[-1] * (2 if _upsampler(block) is not None else 1))

    # phase 1 -----------------------------------------------------------------------------
    def mid_frames(self, z: torch.Tensor, on_host: bool, plan: DecodePlan | None = None,
                   store: PhaseOneFile | None = None) -> list[torch.Tensor] | PhaseOneFile:
        """post_quant_conv + conv_in + mid block, then up blocks [0, plan.tile_from), whole-frame for
        each latent frame: a list of [1, C, t, H, W] (the input of up block `tile_from`; t = 1 for
        the first latent frame, 2**(temporal upsamples before it) for the others), or `store` with
        each frame's result put into it."""
        dec, cache, out = self.decoder, TemporalCache(), []
        h, w = z.shape[3], z.shape[4]
        whole = Tile(0, h, 0, w)
        for i in range(z.shape[2]):
            x = conv3d(z[:, :, i:i + 1], self.vae.post_quant_conv.weight, self.vae.post_quant_conv.bias)
            x = causal_conv(dec.conv_in, x, cache, "conv_in", self.ops)
            x = residual_block(dec.mid_block.resnets[0], x, cache, "mid.0", self.ops)
            for j, (attn, res) in enumerate(zip(dec.mid_block.attentions, dec.mid_block.resnets[1:])):
                x = attn(x)
                x = residual_block(res, x, cache, f"mid.{j + 1}", self.ops)
            if plan is not None and plan.tile_from > 0:
                pieces = [p.cpu() if on_host else p for p in
                          self._up_path(x, cache, whole, h, w, (0, 0), i == 0, plan, stop=plan.tile_from)]
                del x
                x = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)
                del pieces
            if store is not None:
                store.put(x)
            else:
                out.append(x.cpu() if on_host else x)
            del x
        return out if store is None else store

    def crop_regions(self, plan: DecodePlan, h: int, w: int) -> list[tuple[int, int, int, int]]:
        """(y0, y1, x0, x1) of each tile's halo-extended crop of the phase-1 results."""
        return [self.crop(tile, plan.tile_from, h, w) for tile in tile_grid(h, w, plan.ny, plan.nx)]

    def crop(self, tile: Tile, b: int, h: int, w: int) -> tuple[int, int, int, int]:
        """(y0, y1, x0, x1): the region of `tile` that up block `b` (the head: b = len(up_blocks)) takes
        as input, its core and halo, at that stage's scale, in a frame of h x w latent pixels."""
        return (*_region(tile.y0, tile.y1, self.scales[b], self.halos[b], h),
                *_region(tile.x0, tile.x1, self.scales[b], self.halos[b], w))

    # phase 2 -----------------------------------------------------------------------------
    def tile_chunks(self, mids: list[torch.Tensor] | PhaseOneFile, tile: Tile, h: int, w: int, plan: DecodePlan,
                    device: torch.device) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield (first frame index, pixels [1, 3, t, Y, X] of the tile's core) for every chunk."""
        cache = TemporalCache(plan.channels_last)
        frame, b = 0, plan.tile_from
        region = y0, y1, x0, x1 = self.crop(tile, b, h, w)
        for i in range(len(mids)):
            if isinstance(mids, PhaseOneFile):
                x = mids.read(i, region).to(device)
            else:
                x = mids[i][:, :, :, y0:y1, x0:x1].to(device, non_blocking=True)
            for out in self._up_path(x, cache, tile, h, w, (y0, x0), first_chunk=i == 0, plan=plan, b=b):
                yield frame, out
                frame += out.shape[2]

    def _up_path(self, x, cache, tile, h, w, origin, first_chunk, plan, b=0, stop=None):
        """Up block `b` onwards and the head for one chunk, `frames_per_step` frames at a time (or up to
        block `stop`, yielding its input).

        Every layer is causal with its own 2-frame cache, so a chunk can be fed through in smaller
        groups of frames with the same result; only the first chunk is special (Wan's first-chunk
        handling of the temporal upsample), and it has a single frame.
        """
        if b == stop:
            yield x
            return
        if b == len(self.decoder.up_blocks):
            yield self._head(x, cache, tile, origin)
            return
        step = max(1, plan.frames_per_step)
        for t0 in range(0, x.shape[2], step):
            y, o = self._block(b, x[:, :, t0:t0 + step], cache, tile, h, w, origin, first_chunk)
            yield from self._up_path(y, cache, tile, h, w, o, first_chunk, plan, b + 1, stop)

    def _block(self, b, x, cache, tile, h, w, origin, first_chunk):
        """Up block `b` on a tile crop whose top-left is `origin`; returns the crop the next stage needs."""
        block = self.decoder.up_blocks[b]
        shortcut = x if getattr(block, "avg_shortcut", None) is not None else None
        for r, res in enumerate(block.resnets):
            x = residual_block(res, x, cache, f"up{b}.res{r}", self.ops)
        up = _upsampler(block)
        if up is not None:
            x = resample_up(up, x, cache, f"up{b}.up", first_chunk, self.ops, self.subpixel)
            origin = (origin[0] * 2, origin[1] * 2)
        if shortcut is not None:    # Wan2.2: parameter-free DupUp3D shortcut of the block input
            dup = block.avg_shortcut
            self.ops.dup_up_add(x, shortcut, dup.factor_t, dup.factor_s, first_chunk)
            del shortcut
        # Crop to what the next stage can still see: the halo shrinks stage by stage.
        y0, y1, x0, x1 = self.crop(tile, b + 1, h, w)
        if (y0, x0) != origin or (y1 - y0, x1 - x0) != tuple(x.shape[-2:]):
            crop = cache.empty((*x.shape[:3], y1 - y0, x1 - x0), x)
            self.ops.window_gather(x, crop, y0 - origin[0], x0 - origin[1])
            x = crop
        return x, (y0, x0)

    def _head(self, x, cache, tile, origin):
        dec = self.decoder
        x = causal_conv(dec.conv_out, x, cache, "head.conv_out", self.ops, norm=dec.norm_out)
        s = self.scales[-1]
        cy, cx = tile.y0 * s - origin[0], tile.x0 * s - origin[1]
        x = x[:, :, :, cy:cy + (tile.y1 - tile.y0) * s, cx:cx + (tile.x1 - tile.x0) * s]
        if self.patch > 1:
            x = _unpatchify(x, self.patch)
        return x.clamp(-1.0, 1.0)


def _unpatchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """[N, C*p*p, T, H, W] -> [N, C, T, H*p, W*p], Wan2.2's channel order (as diffusers' unpatchify)."""
    n, cpp, t, h, w = x.shape
    c = cpp // (p * p)
    return x.reshape(n, c, p, p, t, h, w).permute(0, 1, 4, 5, 3, 6, 2).reshape(n, c, t, h * p, w * p)


def decode_chunks(vae, z: torch.Tensor, plan: DecodePlan, kernels: str | VaeOps = "auto",
                  spill_dir: str | None = None) -> Iterator[tuple[int, Tile, torch.Tensor, bool]]:
    """Decode one clip z [1, z, T, h, w]: yield (first frame, tile, pixels [1, 3, t, Y, X], last_tile).

    kernels: the memory-bound ops' table (vidgen.ops.op_table), or a backend name (config.KERNELS)
    to resolve for z's device. spill_dir: where a `mid_in_file` plan's temporary file goes (None:
    the temp folder).
    """
    dev = WanStreamingDecoder(vae, kernels if isinstance(kernels, VaeOps) else op_table(kernels, z.device),
                              plan.subpixel)
    device = z.device
    h, w = z.shape[-2:]
    store = PhaseOneFile(dev.crop_regions(plan, h, w), spill_dir) if plan.mid_in_file else None
    try:
        with torch.no_grad():
            mids = dev.mid_frames(z, on_host=plan.mid_on_host, plan=plan, store=store)
            tiles = tile_grid(h, w, plan.ny, plan.nx)
            for k, tile in enumerate(tiles):
                for frame, pixels in dev.tile_chunks(mids, tile, h, w, plan, device):
                    yield frame, tile, pixels, k == len(tiles) - 1
    finally:
        if store is not None:
            store.close()
