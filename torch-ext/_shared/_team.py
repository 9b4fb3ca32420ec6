"""Device-side teams: a wide row split over K programs that meet on the device, without a second launch.

A *team* is K programs that each keep one chunk of a row in registers, publish a few fp32
partial statistics of their chunk to a workspace, wait until all K teammates have published,
combine the K partials in a fixed order (the same bits on every run and in every member) and
then write their chunk's output from registers: one DRAM read and one write per element.
A kernel may meet several times (stages: e.g. a mean, then a variance around it) by waiting
for ``stage * K`` arrivals on the same counter.

Forward progress. Programs may start in any order and a spinning program holds its slot, so
a team must only ever wait on programs that are already running or that are certain to start.
``team_ticket`` therefore takes the *logical* program id from a global counter
(``atomic_add``) instead of ``program_id``: tickets are handed out in start order, so the
programs that have started hold exactly tickets ``0 .. T-1``. Every team whose tickets all lie
below T is fully resident (or done) and finishes; only the last, partially started team can
wait, and its missing members get the slots the finished teams free. This needs K programs to
fit on the device at once (the host keeps K <= the number of SMs).

Memory ordering: a member's partial stores are made visible to the CTA by a barrier and then
published with a release ``atomic_add`` on the team's arrival counter; the waiting side polls
that counter with acquire semantics, synchronises the CTA, and reads the partials with
``cache_modifier=".cg"`` (L2, not a possibly stale L1 line).

Counters: ``sync`` is an int32 tensor of ``1 + teams`` zeros made by the host per call
(``torch.zeros``: one memset, no host sync, fine in CUDA graphs and under torch.compile):
``sync[0]`` is the ticket counter, ``sync[1 + team]`` the team's arrival count.

The Triton interpreter runs programs one after the other, so a waiting program would spin for
ever there. The kernels take a ``PHASE`` constexpr: 0 = everything in one launch (the GPU path);
p >= 1 = only the work between meeting p - 1 and meeting p (1: publish the first partials;
last: wait and write). Under the interpreter the host launches phases 1, 2, ... with the same
``sync`` (``team_phases``; later tickets continue past ``total`` and are taken modulo ``total``;
every count a phase waits for was reached by the phase before), which runs the same ticket,
publish and combine code without ever spinning. A team of one (K = 1) never waits on anybody.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ._device import MAX_THREADS_PER_PROGRAM, device_warp_size

# Streaming multiprocessors assumed for a CPU tensor (the interpreter), so that CPU tests split rows too.
CPU_SMS = 8
# The partials are read as a vector of at least this many (one compiled kernel across row widths).
TEAM_P2_MIN = 64


@triton.jit
def team_ticket(sync_ptr, total):
    """This program's logical id in start order, in [0, total) (int64)."""
    return (tl.atomic_add(sync_ptr, 1, sem="relaxed") % total).to(tl.int64)


@triton.jit
def team_member(sync_ptr, ws_ptr, rows, TEAM, N, BLOCK_N: tl.constexpr):
    """Where this program sits in a team kernel of ``rows`` rows of ``N`` columns, ``TEAM`` programs per row:
    ``(row, member, offs, mask, part, flag)``: its row and member index (from ``team_ticket``, int64), its
    chunk's columns ``member * BLOCK_N + arange(BLOCK_N)`` and their mask ``< N``, the row's first
    partial in the workspace ``ws_ptr`` (one slot per member: ``ws_ptr + row * TEAM``) and the row's
    arrival counter (``sync_ptr + 1 + row``)."""
    ticket = team_ticket(sync_ptr, rows * TEAM)
    row = ticket // TEAM
    member = ticket % TEAM
    offs = member * BLOCK_N + tl.arange(0, BLOCK_N)
    return row, member, offs, offs < N, ws_ptr + row * TEAM, sync_ptr + 1 + row


@triton.jit
def team_arrive(flag_ptr):
    """Publish: every thread's earlier stores of this program become visible before the count grows."""
    tl.debug_barrier()
    tl.atomic_add(flag_ptr, 1, sem="release")


@triton.jit
def team_wait(flag_ptr, count):
    """Spin until ``count`` members have arrived at ``flag_ptr`` (acquire), then synchronise the program."""
    n = tl.atomic_add(flag_ptr, 0, sem="acquire")
    while n < count:
        n = tl.atomic_add(flag_ptr, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def team_load(ptr, k, count, other):
    """The ``count`` partials ``ptr[k]`` of a team (``k`` = arange over a power of 2), from L2."""
    return tl.load(ptr + k, mask=k < count, other=other, cache_modifier=".cg")


def team_phases(device, team: int, meetings: int = 1) -> tuple:
    """The PHASE values to launch a team kernel with: ``(0,)`` (one launch, members spin) on a GPU or
    for a team of one; ``(1, ..., meetings + 1)`` under the interpreter (CPU tensors), which runs
    programs one at a time."""
    return (0,) if device.type != "cpu" or team == 1 else tuple(range(1, meetings + 2))


@functools.lru_cache(maxsize=64)
def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device; ``CPU_SMS`` for anything else."""
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return CPU_SMS


def team_p2(team: int) -> int:
    """The TEAM_P2 constexpr of a team of ``team`` members: a power of 2 >= team, at least TEAM_P2_MIN."""
    return max(triton.next_power_of_2(team), TEAM_P2_MIN)


def team_split(N: int, elem: int, rows: int, device: torch.device, tuned: Optional[dict],
               on_cpu: bool) -> Optional[Tuple[int, int, int]]:
    """``(team, block_n, num_warps)`` for ``rows`` rows of ``N`` elements of ``elem`` bytes, or None (no team).

    ``tuned``: ``{"min_row_bytes", "chunk_bytes", "num_warps"}`` or None (never); ``on_cpu``: teams on CPU
    tensors (the interpreter). Rows of at least ``min_row_bytes`` go to ceil(N / block_n) programs of
    ``block_n`` = chunk_bytes / elem (a power of 2) columns. A team never exceeds the SM count, so that all
    its members can be resident at once (the forward-progress condition above).
    """
    if tuned is None or (device.type == "cpu" and not on_cpu) or N * elem < tuned["min_row_bytes"]:
        return None
    block = triton.next_power_of_2(max(tuned["chunk_bytes"] // elem, 1))
    team = triton.cdiv(N, block)
    if team > sm_count(device) or rows * team >= 2**31:
        return None
    warps = max(min(tuned["num_warps"], MAX_THREADS_PER_PROGRAM // device_warp_size(device)), 1)
    return team, block, warps
