"""Launch configs for the matmul kernel: per-GPU JSON files and the nearest-bucket lookup.

Files
-----
``configs/<GPU name>.json`` (spaces -> ``_``, e.g. ``NVIDIA_H200.json`` for
``torch.cuda.get_device_name() == "NVIDIA H200"``) holds a list of buckets; each bucket is
a problem shape ``(M, N, K)`` and the tile settings for it (``BLOCK_M``, ``BLOCK_N``,
``BLOCK_K``, ``GROUP_M``, ``num_warps``, ``num_stages``; optional, default 0/1: ``TMA``,
``PERSISTENT`` (0, or 1 / 2 programs per SM), ``WARP_SPECIALIZE``, ``EPILOGUE_SUBTILE``, ``SPLIT_K``:
the Hopper kernel's options, see ``matmul``; ``GEMV``: calls with at most ``GEMV_MAX_M`` rows run the
CUDA-core GEMV kernel, ``BLOCK_N`` (any power of two >= 1) output columns per program; ``STREAM_K``: the
stream-K kernel, k iterations shared equally by ``max(1, PERSISTENT)`` programs per SM; ``SUB_N`` (default 1; 1, 2
or 3): the TMA kernel's tiles are ``SUB_N * BLOCK_N`` columns wide, one accumulator per ``BLOCK_N`` columns, so a
tile width that is not a power of two, e.g. 192 = 3 x 64, fills the SMs in fewer waves; ``GLUON`` (0, 1 or 2): on
sm_90, the warp-specialised Gluon kernel of ``matmul_sm90``, cooperative (1) or ping-pong (2) consumers, where it is
eligible (see ``MatmulConfig.gluon``)).
``"tuned": false`` marks files written by hand; ``triton-collection
tune`` writes ``"tuned": true`` files with the measured TFLOP/s per bucket and the GPU's architecture
(``"arch": "sm_90"``, NVIDIA CUDA only). A GPU without a file of its own uses a tuned file of its architecture
(the first by file name: the H200's serves every sm_90 GPU, e.g. H100 SXM / PCIe, H800, GH200, whose SMs
are the same; the persistent grids size themselves to the device's SM count), else, like the Triton
interpreter (CPU tensors), ``configs/default.json``: small tiles and 3 stages that fit every supported GPU.

Optional per bucket: ``"epilogue"``, one of :data:`EPILOGUES` (``matmul``'s ``activation`` names): the entry
serves only calls with that activation, e.g. ``{"M": 4096, "N": 12288, "K": 3072, "epilogue": "gelu_tanh", ...}``
next to the plain ``{"M": 4096, "N": 12288, "K": 3072, ...}`` (an expensive activation in the epilogue can
favour another pipeline depth than the plain GEMM). Entries without it serve every call, as before. For a
gated epilogue the bucket's ``N`` counts output columns (half of b's), as the lookup's ``N`` does.
``triton-collection tune --epilogue NAME`` measures and writes such entries. Whether a bias is added does
not enter the key.

Lookup
------
Among the buckets that serve the call (no ``"epilogue"``, or the call's activation), the one nearest to the
call's ``(M, N, K)`` in log2 distance
``|log2 M - log2 Mb| + |log2 N - log2 Nb| + |log2 K - log2 Kb|`` wins; at equal distance an entry for the
call's activation wins over a plain one, then the first in the file. Its block sizes are then clamped to
``max(16, next_pow2(dim))`` so a tiny problem
does not run mostly-masked tiles (16 is ``tl.dot``'s minimum; a GEMV config's BLOCK_N has no floor), and ``num_warps`` to
``1024 / warp_size`` threads per program. Gated epilogues given a plain bucket use half of its ``BLOCK_N``
(they run two accumulators) and one program per tile (no persistent loop, whole-tile epilogue); an entry
for the call's activation is used as written (it was tuned with that epilogue). fp32 operands use half of
the bucket's ``BLOCK_K``. ``SUB_N`` is lowered to the sub-tiles that N needs (``ceil(N / BLOCK_N)``), and
is 1 for every gated call. A config whose pipeline does not fit the
device's shared memory runs with fewer ``num_stages`` (see ``matmul._launch_fitting``). The
kernel masks every edge, so correctness never depends on which config is picked.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional, Tuple

import torch

from ._device import MAX_THREADS_PER_PROGRAM, cdiv, config_cache, next_power_of_2

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
# the activations a bucket's "epilogue" may name (``matmul``'s ``activation`` argument) -> gated (p * act(g))
EPILOGUES = {"gelu": False, "gelu_tanh": False, "silu": False, "relu": False, "geglu": True, "swiglu": True}


@dataclass(frozen=True)
class MatmulConfig:
    """Tile settings of one launch (see the module docstring)."""

    block_m: int  # rows of C per program
    block_n: int  # columns of C per program (of the activated output for gated epilogues)
    block_k: int  # K step of the main loop
    group_m: int  # programs along M sharing a band of B (L2 reuse); >= 1
    num_warps: int
    num_stages: int
    # Hopper+ fast path (NVIDIA sm_90 and newer, fp16/bf16, 16-byte aligned operands): TMA descriptor loads
    # and stores; elsewhere (or when an operand is not aligned) these are ignored and the pointer kernel runs.
    tma: int = 0  # 1: the TMA-descriptor kernel where eligible
    persistent: int = 0  # 1 / 2: one / two programs per SM looping over tiles (TMA kernel only)
    warp_specialize: int = 0  # 1: tl.range(warp_specialize=True) over tiles (TMA kernel only)
    epilogue_subtile: int = 0  # 1: the epilogue stores two (BLOCK_M, BLOCK_N / 2) halves (TMA kernel only)
    split_k: int = 1  # > 1: programs per tile splitting K, fp32 partials summed in order (TMA, not persistent)
    # 1: calls with M <= GEMV_MAX_M rows run the GEMV kernel (CUDA cores, W streamed with wide loads); then
    # block_n (>= 1) is the number of output columns per program and block_k the K chunk; block_m is ignored
    gemv: int = 0
    # 1: stream-K (TMA kernel only): max(1, persistent) programs per SM share the tiles' k iterations equally;
    # pieces of a tile cut between programs are summed in program order (deterministic) by the last to arrive
    stream_k: int = 0
    # 1, 2, 3: the TMA kernel's tiles are sub_n * block_n columns wide, one fp32 accumulator (and one b block per
    # k step, one epilogue) per block_n columns; plain epilogues, not stream-K (elsewhere tiles are block_n wide)
    sub_n: int = 1
    # 1 / 2: the sm_90 warp-specialised Gluon kernel (``matmul_sm90``; NVIDIA capability 9.0, plain epilogues, no
    # saved pre-activation, b = w.T of a K-major w) with block_m x block_n tiles, block_k steps, a ring of num_stages,
    # two consumer warpgroups cooperating on each tile (1; block_m 128 or 256) or taking turns over tiles (2, "ping-
    # pong"; block_m 64 or 128); the other options are then ignored. Elsewhere the config's other kernels run.
    gluon: int = 0

    def as_list(self) -> list:
        return [self.block_m, self.block_n, self.block_k, self.group_m, self.num_warps, self.num_stages,
                self.tma, self.persistent, self.warp_specialize, self.epilogue_subtile, self.split_k, self.gemv,
                self.stream_k, self.sub_n, self.gluon]

    @classmethod
    def from_list(cls, values) -> "MatmulConfig":
        return cls(*(int(v) for v in values))

    @classmethod
    def from_json(cls, entry: dict) -> "MatmulConfig":
        """A config from one bucket of a JSON file (the optional Hopper keys default to 0)."""
        return cls(int(entry["BLOCK_M"]), int(entry["BLOCK_N"]), int(entry["BLOCK_K"]), int(entry["GROUP_M"]),
                   int(entry["num_warps"]), int(entry["num_stages"]), int(entry.get("TMA", 0)),
                   int(entry.get("PERSISTENT", 0)), int(entry.get("WARP_SPECIALIZE", 0)),
                   int(entry.get("EPILOGUE_SUBTILE", 0)), int(entry.get("SPLIT_K", 1)), int(entry.get("GEMV", 0)),
                   int(entry.get("STREAM_K", 0)), int(entry.get("SUB_N", 1)), int(entry.get("GLUON", 0)))

    def to_json(self) -> dict:
        """The JSON keys of this config (inverse of :meth:`from_json`)."""
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k, "GROUP_M": self.group_m,
                "num_warps": self.num_warps, "num_stages": self.num_stages, "TMA": self.tma,
                "PERSISTENT": self.persistent, "WARP_SPECIALIZE": self.warp_specialize,
                "EPILOGUE_SUBTILE": self.epilogue_subtile, "SPLIT_K": self.split_k, "GEMV": self.gemv,
                "STREAM_K": self.stream_k, "SUB_N": self.sub_n, "GLUON": self.gluon}

    def check(self) -> None:
        """Raises ValueError for block sizes that are not powers of two >= 16 (GEMV configs: block_n >= 1),
        or bad group/warps/stages/flags/sub_n."""
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if self.gemv == 1 and name == "block_n":
                if v < 1 or v & (v - 1):
                    raise ValueError(f"block_n of a GEMV config (output columns per program) must be a power of "
                                     f"two >= 1, got {v}")
            elif v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16 (tl.dot's minimum), got {v}")
        if self.group_m < 1 or self.num_stages < 1:
            raise ValueError(f"group_m and num_stages must be >= 1, got {self.group_m} and {self.num_stages}")
        if self.num_warps < 1 or self.num_warps & (self.num_warps - 1):
            raise ValueError(f"num_warps must be a power of two, got {self.num_warps}")
        for name in ("tma", "warp_specialize", "epilogue_subtile", "gemv", "stream_k"):
            if getattr(self, name) not in (0, 1):
                raise ValueError(f"{name} must be 0 or 1, got {getattr(self, name)}")
        if self.persistent not in (0, 1, 2):
            raise ValueError(f"persistent must be 0, 1 or 2 (programs per SM), got {self.persistent}")
        if self.split_k < 1:
            raise ValueError(f"split_k must be >= 1, got {self.split_k}")
        if self.gluon not in (0, 1, 2):
            raise ValueError(f"gluon must be 0, 1 (cooperative) or 2 (ping-pong), got {self.gluon}")
        if self.sub_n not in (1, 2, 3):
            raise ValueError(f"sub_n must be 1, 2 or 3 (accumulators of block_n columns per tile), got {self.sub_n}")


def config_file_name(gpu_name: str) -> str:
    """``"NVIDIA H200"`` -> ``"NVIDIA_H200.json"``."""
    return "_".join(gpu_name.split()) + ".json"


class Bucket(NamedTuple):
    """One entry of a config file."""

    shape: Tuple[int, int, int]  # (M, N, K); N: output columns
    config: MatmulConfig
    epilogue: Optional[str] = None  # the activation this entry serves (see the module docstring); None: every call


def parse_buckets(data: dict, source: str = "config file") -> Tuple[Bucket, ...]:
    """The buckets of a config file's parsed JSON (``{"configs": [...]}``), each config checked.

    Raises:
        ValueError: no buckets, a bad config, or an ``"epilogue"`` that is not in :data:`EPILOGUES` (names ``source``).
    """
    out = []
    for b in data["configs"]:
        cfg = MatmulConfig.from_json(b)
        cfg.check()
        epilogue = b.get("epilogue")
        if epilogue is not None and epilogue not in EPILOGUES:
            raise ValueError(f"{source}: bucket {(b['M'], b['N'], b['K'])} has epilogue {epilogue!r}; expected one "
                             f"of {', '.join(EPILOGUES)} (or no key)")
        out.append(Bucket((int(b["M"]), int(b["N"]), int(b["K"])), cfg, epilogue))
    if not out:
        raise ValueError(f"{source} has no configs")
    return tuple(out)


def config_path(gpu_name: Optional[str], arch: Optional[str] = None) -> Path:
    """The config file a GPU uses: ``gpu_name``'s own; else the first (by name) tuned file whose ``"arch"`` is
    ``arch`` (e.g. ``"sm_90"``); else ``default.json`` (also for ``gpu_name`` None: CPU tensors). Read through
    :func:`load_buckets`, which caches the result."""
    path = CONFIG_DIR / config_file_name(gpu_name) if gpu_name else None
    if path is not None and path.is_file():
        return path
    if gpu_name and arch:
        for candidate in sorted(CONFIG_DIR.glob("*.json")):
            data = json.loads(candidate.read_text(encoding="utf-8"))
            if isinstance(data, dict) and data.get("tuned") is True and data.get("arch") == arch:
                return candidate
    return CONFIG_DIR / "default.json"


@functools.lru_cache(maxsize=16)
def load_buckets(gpu_name: Optional[str], arch: Optional[str] = None) -> Tuple[Bucket, ...]:
    """The buckets of the config file ``gpu_name`` (of architecture ``arch``) uses: :func:`config_path`."""
    path = config_path(gpu_name, arch)
    return parse_buckets(json.loads(path.read_text(encoding="utf-8")), str(path))


def _clamp_block(block: int, dim: int) -> int:
    return max(16, min(block, next_power_of_2(max(dim, 1))))


def lookup(buckets: Tuple[Bucket, ...], M: int, N: int, K: int, gated: bool = False, warp_size: int = 32,
           itemsize: int = 2, activation: Optional[str] = None) -> MatmulConfig:
    """The config ``buckets`` give an (M, N, K) call (N: output columns) with ``activation``, clamped (module
    docstring); ``gated`` (also implied by a gated ``activation``) derives a gated config from a plain bucket.

    Raises:
        ValueError: no bucket serves the call (a file holding only ``"epilogue"`` entries for other activations).
    """
    def dist(shape):
        return sum(abs(math.log2(max(x, 1)) - math.log2(max(b, 1))) for x, b in zip((M, N, K), shape))

    serving = [(dist(b.shape), b.epilogue is None, i, b) for i, b in enumerate(buckets)
               if b.epilogue is None or b.epilogue == activation]
    if not serving:
        raise ValueError(f"no config bucket serves activation={activation!r}: add one without an \"epilogue\" key")
    bucket = min(serving)[3]
    cfg = bucket.config
    derive = (gated or EPILOGUES.get(activation, False)) and bucket.epilogue is None
    low_n = 1 if cfg.gemv else 16
    block_n = max(low_n, cfg.block_n // 2) if derive else cfg.block_n
    block_k = max(16, cfg.block_k // 2) if itemsize > 2 else cfg.block_k
    block_n = max(low_n, min(block_n, next_power_of_2(max(N, 1))))
    return MatmulConfig(
        block_m=_clamp_block(cfg.block_m, M),
        block_n=block_n,
        block_k=_clamp_block(block_k, K),
        group_m=cfg.group_m,
        num_warps=min(cfg.num_warps, MAX_THREADS_PER_PROGRAM // warp_size),
        num_stages=cfg.num_stages,
        tma=cfg.tma,
        # gated: two accumulators; measured on the H200 (2026-11-30) one program per tile beat the persistent
        # loop by 10-20% for them, so a plain bucket's persistent / split-epilogue options apply to plain epilogues only
        persistent=0 if derive else cfg.persistent,
        warp_specialize=cfg.warp_specialize,
        epilogue_subtile=0 if derive else cfg.epilogue_subtile,
        split_k=cfg.split_k,
        gemv=cfg.gemv,
        stream_k=cfg.stream_k,
        # gated calls run two accumulators per tile instead (see the module docstring)
        sub_n=1 if gated or EPILOGUES.get(activation, False) else min(cfg.sub_n, cdiv(max(N, 1), block_n)),
        gluon=0 if derive or gated else cfg.gluon,
    )


@config_cache(4096)
def pick_config(M: int, N: int, K: int, gpu_name: Optional[str] = None, gated: bool = False,
                warp_size: int = 32, itemsize: int = 2, activation: Optional[str] = None,
                arch: Optional[str] = None) -> MatmulConfig:
    """:func:`lookup` in ``gpu_name``'s config file (where it has none, a tuned file of its architecture ``arch``,
    e.g. ``"sm_90"``, else ``default.json``: :func:`config_path`): the tiles, warps and stages ``matmul`` launches
    an (M, K) @ (K, N) product with.

    ``itemsize``: bytes per operand element; 4 (fp32) halves BLOCK_K so a stage takes the shared memory
    that the bucket (tuned on 16-bit operands) planned for. ``activation``: the call's ``matmul`` activation
    (None: none), which picks a bucket's ``"epilogue"`` entry where the file has one.

    Raises:
        ValueError: M, N or K not an int >= 0 (K = 0: the product of empty operands, zeros), warp_size not 32 or
            64, itemsize not 2 or 4, an activation ``matmul`` does not take, a gpu_name or arch that is neither None
            nor a string (checked once per cached signature; an unhashable argument is checked on each call).
    """
    for name, value in (("M", M), ("N", N), ("K", K)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"pick_config: {name} must be an int >= 0, got {value!r}")
    if warp_size not in (32, 64) or itemsize not in (2, 4):
        raise ValueError(f"pick_config: warp_size must be 32 or 64 and itemsize 2 or 4, got {warp_size!r}, {itemsize!r}")
    if activation is not None and (not isinstance(activation, str) or activation not in EPILOGUES):
        raise ValueError(f"pick_config: activation must be None or one of {', '.join(map(repr, EPILOGUES))}, "
                         f"got {activation!r}")
    if arch is not None and not isinstance(arch, str):
        raise ValueError(f"pick_config: arch must be None or a string such as 'sm_90', got {arch!r}")
    if gpu_name is not None and not isinstance(gpu_name, str):
        raise ValueError(f"pick_config: gpu_name must be None or a string such as 'NVIDIA H200', got {gpu_name!r}")
    return lookup(load_buckets(gpu_name, arch), M, N, K, gated, warp_size, itemsize, activation)


@functools.lru_cache(maxsize=64)
def device_info(device: torch.device) -> Tuple[Optional[str], int, Optional[str]]:
    """(GPU name or None on CPU, warp size, architecture ``"sm_<major><minor>"`` on NVIDIA CUDA else None) of
    ``device``."""
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        arch = None if torch.version.hip is not None else f"sm_{props.major}{props.minor}"
        return props.name, int(getattr(props, "warp_size", 32)), arch
    if device.type == "xpu" and hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.xpu.get_device_name(device), 32, None
    return None, 32, None


@functools.lru_cache(maxsize=64)
def tma_capable(device: torch.device) -> Tuple[bool, int]:
    """(True on NVIDIA sm_90+ (TMA, warpgroup MMA), number of SMs) of ``device``; (False, 1) elsewhere."""
    if device.type == "cuda" and torch.cuda.is_available() and torch.version.hip is None:
        props = torch.cuda.get_device_properties(device)
        return props.major >= 9, int(props.multi_processor_count)
    return False, 1


def config_for(M: int, N: int, K: int, device: torch.device, gated: bool, itemsize: int = 2,
               activation: Optional[str] = None) -> MatmulConfig:
    name, warp, arch = device_info(device)
    return pick_config(M, N, K, name, gated, warp, itemsize, activation, arch)
