"""Cross-entropy launch settings on the GPU (issue 4): one block per row against the looped kernel, chunk sizes,
warps and L2 hints, timed in interleaved rounds next to eager, Liger and torch.compile.

python3 benchmarks/cross_entropy_sweep.py --out DIR [--rounds 3] [--budget S] [--cpu]

A row of up to 64 KiB runs in one block (read once); a wider one loops: a first pass for the row's max and sum
of exp, then a gradient pass that re-reads the row (newest chunks first, so partly from L2). Each setting is
checked against fp64 torch on the GPU first (bf16/fp32: loss and gradient within 2^-7 of the largest reference
value; NaN exactly where torch's), then every setting of a shape is timed once per round, rounds interleaved;
the median over rounds is reported. Bytes: fwd+bwd 2 M V e (read logits, write the gradient), fwd alone M V e.
Records: DIR/ce.jsonl; the table: stdout.
"""

import argparse
import statistics
import sys

from sweep_common import Sweep, ce_ref, load_liger, load_packages, prepare

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--budget", type=float, default=400)
ap.add_argument("--cpu", action="store_true")
ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays (kernel time, no host Python)")
ap.add_argument("--skip", default="", help="comma list of sections to skip: check, ce, softmax")
args = ap.parse_args()
OUT = prepare(args.out, args.cpu)
RUN = Sweep(OUT / "ce.jsonl", args.budget, args.cpu, rep=25, min_left=4, widths=(14, 34, 14, 9, 6))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEV = RUN.dev
(sm,) = load_packages(["triton-softmax"], args.cpu)
L = sys.modules[sm.__name__ + "._launch"]
ORIG_PICK, LOOP_TUNED = L.pick_config, dict(L.LOOP_TUNED)
liger_sm, liger_ce = load_liger(RUN.log)
if DEV == "cuda":
    RUN.copy_ceiling()


def looped(block_bytes, warps, prefetch=True, evict=("evict_last", "evict_first")):
    return L.LaunchConfig(block_n=block_bytes // 2, num_warps=warps, loop=True, reverse=True, evict=evict,
                          prefetch=prefetch)


def one_block(V, warps):
    return L.LaunchConfig(block_n=1 << (V - 1).bit_length(), num_warps=warps, loop=False)


def vname(c):
    if c is None:
        return "shipped"
    if not c.loop:
        return f"one block w{c.num_warps}"
    return (f"loop {c.block_n * 2 // 1024}K w{c.num_warps}{' pf' if c.prefetch else ''}"
            f"{' ld:' + c.evict[0] if c.evict[0] != 'evict_last' else ''}")


def use(V, c):
    """Rows of V classes (bf16 logits) launch with setting ``c`` (None: as shipped)."""
    L.pick_config = ORIG_PICK
    L.LOOP_TUNED.update(LOOP_TUNED)
    if c is not None:
        L.LOOP_TUNED["cross_entropy"] = L.LOOP_TUNED["cross_entropy_grad"] = None
        L.pick_config = lambda n, e, w=32: c if n == V else ORIG_PICK(n, e, w)
    L.retuned()  # the launch plans follow the setting


WIDE = [None, looped(4096, 4), looped(4096, 2), looped(8192, 4, evict=("", "evict_first")), looped(4096, 4, prefetch=False),
        looped(2048, 2), looped(4096, 8), looped(8192, 8)]
MID = [None, looped(8192, 4), looped(4096, 4), looped(4096, 2), looped(16384, 8, prefetch=False), looped(8192, 8),
       looped(2048, 2)]
if DEV == "cuda":
    SHAPES = [(8192, 128256, WIDE), (8192, 32000, MID + [one_block(32000, 16), one_block(32000, 8)]),
              (16384, 16384, MID + [one_block(16384, 8), one_block(16384, 4)]),
              (32768, 8192, [None, one_block(8192, 4), one_block(8192, 2), looped(4096, 4), looped(4096, 2)]),
              (8192, 50257, MID)]
else:
    SHAPES = [(4, 40000, WIDE[:3]), (4, 20000, MID[:2] + [one_block(20000, 4)])]


def close(a, ref, rel):
    """|a - ref| <= rel * max|ref| where ref is finite; NaN exactly where ref is NaN."""
    a, ref = a.double(), ref.double()
    fin = torch.isfinite(ref)
    if not torch.equal(torch.isnan(a), torch.isnan(ref)):
        return False
    if not fin.any():
        return True
    return float((a - ref)[fin].abs().max()) <= rel * float(ref[fin].abs().max()) + 1e-30


def check():
    """Every setting against fp64 torch, on rows with -inf runs, a NaN, a +inf, a large logit, ignored targets,
    label smoothing and z-loss, bf16 and fp32."""
    for M0, V, variants in SHAPES:
        M, N = 8, V
        x = torch.randn(M, N, device=DEV) * 3
        x[1] = float("-inf")
        x[2, : N // 2] = float("-inf")
        x[3, 123] = float("nan")
        x[4, N // 3] = float("inf")
        x[5, 17] = 80.0
        t = torch.randint(0, N, (M,), device=DEV)
        t[::5] = -100
        t[5] = 17
        for dtype in (torch.bfloat16, torch.float32):
            xd = x.to(dtype)
            for c in variants:
                if c is not None and dtype == torch.float32:  # the setting is for bf16 rows: fp32 doubles the bytes
                    c = L.LaunchConfig(**{**c.__dict__, "block_n": c.block_n // 2 if c.loop else c.block_n})
                use(V, c)
                xs = xd.clone().requires_grad_()
                loss = sm.cross_entropy(xs, t, reduction="none", label_smoothing=0.05, z_loss=1e-4)
                (g,) = torch.autograd.grad(loss.sum(), xs)
                xr = xd.double().requires_grad_()
                ref = ce_ref(xr, t, reduction="none", label_smoothing=0.05, z_loss=1e-4)
                (gr,) = torch.autograd.grad(ref.sum(), xr)
                ok = close(loss, ref.detach(), 2 ** -7) and close(g, gr, 2 ** -7)
                with torch.no_grad():
                    ok = ok and close(sm.cross_entropy(xd, t), ce_ref(xd, t), 2 ** -7)
                RUN.record(kind="check", V=V, dtype=str(dtype), variant=vname(c), ok=ok)
                RUN.log(f"check V={V} {dtype} {vname(c)}: {'ok' if ok else 'MISMATCH'}")
    use(0, None)


def rounds(op, shape, cands, nbytes):
    """Times every candidate once per round, rounds interleaved; logs and records the medians."""
    times = {k: [] for k in cands}
    for r in range(args.rounds):
        for k, (setting, fn) in cands.items():
            if RUN.left() < 5:
                break
            if setting is not False:
                use(*setting)
            try:
                ms = RUN.bench(fn, graph=args.graph)
            except Exception as e:  # noqa: BLE001
                RUN.log("ERR", op, k, type(e).__name__, str(e)[:200])
                cands[k] = (setting, None)
                continue
            finally:
                use(0, None)
            times[k].append(ms)
            RUN.record(kind="sample", op=op, shape=shape, variant=k, round=r, us=ms * 1e3)
    for k, ms in times.items():
        if ms:
            med = statistics.median(ms)
            gb = nbytes / med / 1e6
            RUN.record(kind="time", op=op, shape=shape, variant=k, us_median=med * 1e3, gbps_median=gb,
                       gbps_best=nbytes / min(ms) / 1e6, frac=gb / RUN.copy, rounds=len(ms))
            RUN.log(f"{op:14s} {shape:14s} {k:34s} median {med * 1e3:8.1f} us {gb:6.0f} GB/s "
                    f"({gb / RUN.copy:.0%}) {[round(t * 1e3) for t in ms]}")


def time_ce():
    for M, V, variants in SHAPES:
        x = torch.randn(M, V, device=DEV, dtype=torch.bfloat16)
        t = torch.randint(0, V, (M,), device=DEV)
        t[::10] = -100
        xg = x.clone().requires_grad_()
        cands = {}
        for c in variants:
            cands[vname(c)] = ((V, c), lambda: torch.autograd.grad(sm.cross_entropy(xg, t), xg))
        cands["torch eager"] = (False, lambda: torch.autograd.grad(F.cross_entropy(xg, t), xg))
        if liger_ce is not None:
            cands["liger"] = (False, lambda: torch.autograd.grad(liger_ce(xg, t), xg))
        if DEV == "cuda":
            cf = torch.compile(lambda a, b: F.cross_entropy(a, b), dynamic=False)
            cands["torch.compile"] = (False, lambda: torch.autograd.grad(cf(xg, t), xg))
        rounds("ce_fwdbwd", f"{M}x{V}", cands, 2 * M * V * 2)

        def fwd():
            with torch.no_grad():
                sm.cross_entropy(x, t)
        rounds("ce_fwd", f"{M}x{V}", {vname(c): ((V, c), fwd) for c in variants}, M * V * 2)
        del x, xg


def time_softmax():
    """The softmax forward at the widths where the cross-entropy's one-block rule lost: the same settings."""
    for M, N in ([(16384, 16384), (4096, 32768), (2048, 65536)] if DEV == "cuda" else [(3, 20000)]):
        x = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
        variants = [None, looped(16384, 8, prefetch=False), looped(8192, 4), looped(8192, 4, prefetch=False),
                    looped(4096, 2), looped(4096, 4)]
        if N <= 16384:
            variants += [one_block(N, 8), one_block(N, 4)]
        cands = {vname(c): ((N, c), lambda: sm.softmax(x, -1)) for c in variants}
        for c in variants:
            use(N, c)
            ok = close(sm.softmax(x, -1), torch.softmax(x.double(), -1), 2 ** -7)
            RUN.record(kind="check", op="softmax", N=N, variant=vname(c), ok=ok)
            if not ok:
                RUN.log("MISMATCH softmax", N, vname(c))
        use(0, None)
        cands["torch eager"] = (False, lambda: torch.softmax(x, -1))
        if liger_sm is not None and N <= 65536:
            cands["liger"] = (False, lambda: liger_sm(x))
        if DEV == "cuda":
            cf = torch.compile(lambda a: torch.softmax(a, -1), dynamic=False)
            cands["torch.compile"] = (False, lambda: cf(x))
        rounds("softmax_fwd", f"{M}x{N}", cands, 2 * M * N * 2)
        del x


skip = set(args.skip.split(","))
for name, fn in (("check", check), ("ce", time_ce), ("softmax", time_softmax)):
    if name not in skip:
        RUN.safe(name, fn)
RUN.log("done")
