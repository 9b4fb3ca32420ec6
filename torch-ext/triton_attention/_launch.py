"""Tile sizes and warps of the attention kernels, in one place.

Correctness never depends on the config: every kernel masks the sequence tails and the
padded head dims, so any power-of-two tiles >= 16 give the same result (up to fp32
summation order). The picks below were measured on an H200 at d=128 (the d=64 and d=256
picks are not yet measured); on the Triton interpreter (CPU) tiles are 16 so that small test
shapes cross several blocks.

``num_warps * warp_size <= 1024`` threads per program on every device (AMD wavefronts
have 64 lanes): :func:`clamp_warps` enforces it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Optional

import torch

from ._device import (MAX_THREADS_PER_PROGRAM, check_bool, check_int, check_warp_size, config_cache, device_warp_size,
                      next_power_of_2)



@dataclass(frozen=True)
class FwdConfig:
    """Forward: one program per (BLOCK_M queries, head); keys visited BLOCK_N at a time."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class BwdConfig:
    """Backward: dK/dV per (BLOCK_N1 keys, kv head) over BLOCK_M1 queries; dQ per (BLOCK_M2 queries, head)."""

    block_m1: int
    block_n1: int
    block_m2: int
    block_n2: int
    num_warps: int
    num_stages: int
    num_warps2: Optional[int] = None  # the dQ kernel's warps (None: num_warps)
    num_stages2: Optional[int] = None  # the dQ kernel's stages (None: num_stages)

    @property
    def dq_launch(self) -> dict:
        """``num_warps`` / ``num_stages`` of the dQ kernel."""
        return {"num_warps": self.num_warps if self.num_warps2 is None else self.num_warps2,
                "num_stages": self.num_stages if self.num_stages2 is None else self.num_stages2}


# the largest head dim the kernels take (q/k and v; flash_attention refuses more)
MAX_HEAD_DIM = 256


def clamp_warps(num_warps: int, warp_size: int) -> int:
    """``num_warps`` capped so that ``num_warps * warp_size <= 1024``."""
    check_warp_size(warp_size)
    return max(1, min(num_warps, MAX_THREADS_PER_PROGRAM // warp_size))


def _check_config_args(head_dim: int, interpret: bool, warp_size: int, element_size: int, masked: bool = False):
    """ValueError naming the argument: head_dim not a padded head dim (:func:`padded_head_dim`) of at most
    ``MAX_HEAD_DIM``, element_size not an int >= 1, a bad warp_size, interpret / masked not bools."""
    check_int("head_dim", head_dim, 16)
    if head_dim & (head_dim - 1) or head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be a power of two in [16, {MAX_HEAD_DIM}] (padded_head_dim(d)), got {head_dim}")
    check_int("element_size", element_size, 1)
    check_warp_size(warp_size)
    check_bool("interpret", interpret)
    check_bool("masked", masked)


@config_cache(1024)
def pick_fwd_config(head_dim: int, interpret: bool, warp_size: int = 32, element_size: int = 2,
                    masked: bool = False) -> FwdConfig:
    """Forward tiles for a (padded) head dim ``head_dim`` (a power of two in [16, 256]) and input element size.

    ``masked``: a mask tile is pipelined too; 128x128 tiles then overflow the H200's 227 KiB of shared
    memory (measured: OutOfResources), so masked calls use 64-key tiles.

    Raises:
        ValueError: head_dim not a power of two in [16, 256] (an int; pass :func:`padded_head_dim` of the head
            dim), element_size not an int >= 1, a warp_size that is not a power of two in [1, 1024], interpret or masked
            not a bool (the config pickers of every package raise ValueError, as their ``pick_config`` does).
    """
    _check_config_args(head_dim, interpret, warp_size, element_size, masked)
    if interpret:
        return FwdConfig(16, 16, 1, 1)
    if element_size >= 4:  # fp32 operands: half the tiles (shared memory)
        cfg = FwdConfig(64, 32, 4, 2) if head_dim <= 128 else FwdConfig(32, 32, 4, 1)
    elif masked:
        cfg = FwdConfig(128, 64, 8, 2) if head_dim <= 128 else FwdConfig(64, 32, 8, 2)
    elif head_dim == 64:  # H200 (session 20, results/attention_tiles_2026-12-02.txt): 401 / 363 TFLOP/s at SD3.5's
        cfg = FwdConfig(128, 64, 8, 3)  # 2 x 38 x 4429 / 4 x 32 x 4096 causal against 334 / 309 with 128 x 128
    elif head_dim <= 128:
        cfg = FwdConfig(128, 128, 8, 3)  # H200 d=128: 491-504 TFLOP/s, best of 5 (benchmarks/NOTES.md)
    else:
        cfg = FwdConfig(64, 64, 8, 2)
    return replace(cfg, num_warps=clamp_warps(cfg.num_warps, warp_size))


@config_cache(1024)
def pick_bwd_config(head_dim: int, interpret: bool, warp_size: int = 32, element_size: int = 2) -> BwdConfig:
    """Backward tiles for a (padded) head dim ``head_dim`` (a power of two in [16, 256]) and element size.

    Raises:
        ValueError: head_dim not a power of two in [16, 256] (an int; pass :func:`padded_head_dim` of the head
            dim), element_size not an int >= 1, a warp_size that is not a power of two in [1, 1024], interpret
            not a bool (the config pickers of every package raise ValueError, as their ``pick_config`` does).
    """
    _check_config_args(head_dim, interpret, warp_size, element_size)
    if interpret:
        return BwdConfig(16, 16, 16, 16, 1, 1)
    if element_size >= 4:
        cfg = BwdConfig(32, 64, 64, 32, 4, 1) if head_dim <= 128 else BwdConfig(16, 32, 32, 16, 4, 1)
    elif head_dim <= 128:
        cfg = BwdConfig(64, 64, 64, 64, 4, 2)  # H200 d=128: 326-365 TFLOP/s, best of 4 (benchmarks/NOTES.md)
    else:
        cfg = BwdConfig(32, 64, 64, 32, 4, 2)
    return replace(cfg, num_warps=clamp_warps(cfg.num_warps, warp_size))  # no config here sets num_warps2


def fwd_config_for(t: torch.Tensor, head_dim: int, interpret: bool, masked: bool = False) -> FwdConfig:
    return pick_fwd_config(head_dim, interpret, device_warp_size(t.device), t.element_size(), masked)


def bwd_config_for(t: torch.Tensor, head_dim: int, interpret: bool) -> BwdConfig:
    return pick_bwd_config(head_dim, interpret, device_warp_size(t.device), t.element_size())


def padded_head_dim(d: int) -> int:
    """Head dim rounded up to a power of two, at least 16 (the smallest ``tl.dot`` operand)."""
    return max(16, next_power_of_2(d))
