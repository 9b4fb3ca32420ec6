"""triton-softmax on the GPU: correctness vs torch, then config sweeps and peers, within a time budget.

python3 benchmarks/softmax_gpu_sweep.py --out DIR --budget SECONDS [--round N] [--cpu]

Writes DIR/records.jsonl (one JSON object per measurement, appended as it goes, so a timeout keeps
what was measured), DIR/log.txt (via tee in run.sh) and, with --final, the report files.
Bytes (the issue's accounting): softmax fwd 2*M*N*e (read x, write y); fwd+bwd 5*M*N*e
(x, y; y, dy, dx); bwd alone 3*M*N*e; cross-entropy fwd+bwd 2*M*V*e (read logits, write grad).
"""

import argparse
import contextlib
import json
import os
import sys
import time

from sweep_common import Sweep, capture_cuda_graph, ce_ref, load_liger, load_packages, prepare, ulp_diff

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--budget", type=float, default=170)
ap.add_argument("--round", type=int, default=1)
ap.add_argument("--cpu", action="store_true", help="dry run under the interpreter with tiny shapes")
ap.add_argument("--final", action="store_true", help="write the report (softmax_2026-11-30.{md,json})")
ap.add_argument("--skip", default="", help="comma-separated sections to skip")
args = ap.parse_args()
OUT = prepare(args.out, args.cpu)
RUN = Sweep(OUT / "records.jsonl", args.budget, args.cpu, rep=20 if args.round > 1 else 30)
left, log, record, timeit = RUN.left, RUN.log, RUN.record, RUN.timeit

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

DEV = RUN.dev
REC = RUN.rec

# ------------------------------------------------------------------------------------------ load
(sm,) = load_packages(["triton-softmax"], args.cpu)
S = sys.modules[sm.__name__ + ".softmax"]
C = sys.modules[sm.__name__ + ".cross_entropy"]
L = sys.modules[sm.__name__ + "._launch"]
ORIG_PICK = L.pick_config
if os.environ.get("TEAM_OFF") == "1":  # the smoke test of the team kernels failed: time the previous default
    for _k in L.TEAM_TUNED:
        L.TEAM_TUNED[_k] = None
    L.retuned()
log("loaded", sm.__name__, "torch", torch.__version__, "triton", triton.__version__,
    torch.cuda.get_device_name() if DEV == "cuda" else "cpu")
record(kind="env", torch=torch.__version__, triton=triton.__version__,
       gpu=torch.cuda.get_device_name() if DEV == "cuda" else "cpu")


@contextlib.contextmanager
def override(N, cfg):
    """Every launch with row length N uses ``cfg`` (the public API path, as users call it). A string:
    "old" = the team path off (one program per row, the previous default); "team C W" = every kind on
    the team path with C-byte chunks and W warps."""
    if isinstance(cfg, str):
        saved_team = dict(L.TEAM_TUNED)
        for k in L.TEAM_TUNED:
            L.TEAM_TUNED[k] = None if cfg == "old" else {"min_row_bytes": 1, "chunk_bytes": int(cfg.split()[1]),
                                                          "num_warps": int(cfg.split()[2])}
        L.retuned()  # the launch plans follow the settings
        try:
            yield
        finally:
            L.TEAM_TUNED.update(saved_team)
            L.retuned()
        return
    L.pick_config = lambda n, e, w=32: cfg if (n == N and cfg is not None) else ORIG_PICK(n, e, w)
    tuned = dict(L.LOOP_TUNED)
    saved_team = dict(L.TEAM_TUNED)
    if cfg is not None:
        L.LOOP_TUNED.clear()  # an explicit variant is timed as given
        for k in L.TEAM_TUNED:  # ... on the one-program-per-row path
            L.TEAM_TUNED[k] = None
    L.retuned()
    try:
        yield
    finally:
        L.pick_config = ORIG_PICK
        L.LOOP_TUNED.update(tuned)
        L.TEAM_TUNED.update(saved_team)
        L.retuned()


def cfg_name(c):
    if c is None:
        return "default"
    if isinstance(c, str):
        return "one program per row (previous default)" if c == "old" else \
            f"team {int(c.split()[1]) // 1024}K w{c.split()[2]}"
    s = f"B{c.block_n}w{c.num_warps}" + (f"r{c.rows}" if c.rows > 1 else "")
    if c.loop:
        s += "L" + ("rev" if c.reverse else "") + ("ev" if c.evict[0] else "") + ("pf" if c.prefetch else "") + (f"s{c.split}" if c.split else "")
    return s


def loopcfg(block, nw, opts=True, split=0, pf=True):
    return L.LaunchConfig(block_n=block, num_warps=nw, loop=True, reverse=opts,
                          evict=("evict_last", "evict_first") if opts else ("", ""), split=split, prefetch=pf)


def onecfg(N, nw, rows=1):
    return L.LaunchConfig(block_n=triton.next_power_of_2(N), num_warps=nw, loop=False, rows=rows)


def safe(name, fn):
    return RUN.safe(name, fn, 1 if name == "report" else 5)


# ------------------------------------------------------------------------------------------ peers
liger_sm, liger_ce = load_liger(log)
COPY = RUN.copy_ceiling()


# ------------------------------------------------------------------------------------------ correctness
def check_softmax():
    allshapes = [(64, 1000), (37, 4097), (16, 32768), (8, 65539), (4, 262144)] if DEV == "cuda" else [(4, 100), (2, 20011)]
    plan = {torch.bfloat16: (allshapes, (False, True)), torch.float16: (allshapes[1::2], (False,)),
            torch.float32: (allshapes[1::3], (True,))}
    if args.round == 1:  # time goes to the sweeps; round 2 checks everything
        plan = {torch.bfloat16: (allshapes[1::2], (False, True)), torch.float32: (allshapes[-1:], (False,))}
    for dtype, (shapes, logs) in plan.items():
        for M, N in shapes:
            x = torch.randn(M, N, device=DEV, dtype=dtype) * 3
            for log_ in logs:
                f = sm.log_softmax if log_ else sm.softmax
                tf = torch.log_softmax if log_ else torch.softmax
                xg = x.clone().requires_grad_()
                y = f(xg)
                ref = tf(x.double(), -1)
                dy = torch.randn_like(x)
                y.backward(dy)
                yr = ref.detach().requires_grad_()
                xr = x.double().requires_grad_()
                tf(xr, -1).backward(dy.double())
                torch_y = tf(x, -1)
                u = ulp_diff(y.detach(), ref, dtype)
                ug = float(((xg.grad.double() - xr.grad).abs().max()) / xr.grad.abs().max().clamp(min=1e-30))
                same = float((y.detach() == torch_y).float().mean())
                det = bool(torch.equal(f(x), y.detach()))  # the same bits on a second run
                ok = u <= (1.0 if dtype != torch.float32 else 64.0) and ug < (2e-2 if dtype != torch.float32 else 1e-5)
                ok = ok and det
                record(kind="check", op="log_softmax" if log_ else "softmax", dtype=str(dtype), shape=[M, N],
                       max_ulp=u, grad_rel=ug, equal_torch_frac=same, deterministic=det, ok=ok)
                if not ok:
                    log("CHECK FAIL", "log_softmax" if log_ else "softmax", dtype, (M, N), u, ug)
    log("softmax checks done")


def check_ce():
    shapes = [(64, 128256), (37, 32000), (16, 262144), (64, 4093)] if DEV == "cuda" else [(4, 300), (3, 20011)]
    for dtype in (torch.bfloat16, torch.float16, torch.float32) if args.round > 1 else (torch.bfloat16,):
        for M, V in (shapes if dtype == torch.bfloat16 else shapes[:1]):
            x = torch.randn(M, V, device=DEV, dtype=dtype) * 2
            t = torch.randint(0, V, (M,), device=DEV)
            t[::5] = -100
            kws = ({}, {"label_smoothing": 0.1}, {"z_loss": 1e-4, "reduction": "sum"}, {"reduction": "none"})
            for kw in kws if args.round > 1 or V == shapes[0][1] else kws[:1]:
                xg = x.clone().requires_grad_()
                loss = sm.cross_entropy(xg, t, **kw)
                xr = x.double().requires_grad_()
                ref = ce_ref(xr, t, **kw)
                dl = torch.randn(loss.shape, device=DEV) if loss.dim() else None
                loss.backward(dl.to(loss.dtype) if dl is not None else None)
                ref.backward(dl.to(loss.dtype).double() if dl is not None else None)
                lerr = float(((loss.double() - ref).abs().max()) / ref.abs().max().clamp(min=1e-30))
                gerr = float(((xg.grad.double() - xr.grad).abs().max()) / xr.grad.abs().max().clamp(min=1e-30))
                tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
                ok = lerr < tol and gerr < tol
                # against torch's own F.cross_entropy in the same dtype (what a user compares with)
                tx = x.clone().requires_grad_()
                tl_ = F.cross_entropy(tx, t, **{k: v for k, v in kw.items() if k != "z_loss"})
                entry = dict(kind="check", op="cross_entropy", dtype=str(dtype), shape=[M, V], kw=kw, loss_rel=lerr,
                             grad_rel=gerr, ok=ok)
                if "z_loss" not in kw:
                    tl_.backward(dl.to(tl_.dtype) if dl is not None else None)
                    entry["vs_torch_grad_rel"] = float((xg.grad.double() - tx.grad.double()).abs().max()
                                                       / tx.grad.double().abs().max().clamp(min=1e-30))
                record(**entry)
                if not ok:
                    log("CHECK FAIL ce", dtype, (M, V), kw, lerr, gerr)
    # a second backward through the same graph (retain_graph) and a CUDA graph capture with backward
    x = torch.randn(8, 1000, device=DEV).requires_grad_()
    t = torch.randint(0, 1000, (8,), device=DEV)
    loss = sm.cross_entropy(x, t)
    (loss * 3).backward(retain_graph=True)
    (loss * 3).backward()
    xr = x.detach().double().requires_grad_()
    (ce_ref(xr, t) * 6).backward()
    record(kind="check", op="ce_retain_graph", ok=bool(torch.allclose(x.grad.double(), xr.grad, rtol=1e-5, atol=1e-8)))
    if DEV == "cuda":
        xs = torch.randn(512, 32000, device=DEV, dtype=torch.bfloat16).requires_grad_()
        ts = torch.randint(0, 32000, (512,), device=DEV)

        def step():
            lg = sm.cross_entropy(xs, ts, label_smoothing=0.1)
            lg.backward()
            return lg

        def reset():
            xs.grad = None
        g, lg = capture_cuda_graph(step, reset)
        new = torch.randn_like(xs)
        with torch.no_grad():
            xs.copy_(new)
        xs.grad.zero_()
        g.replay()
        torch.cuda.synchronize()
        xe = new.clone().requires_grad_()
        le = sm.cross_entropy(xe, ts, label_smoothing=0.1)
        le.backward()
        ok = bool(torch.equal(lg, le) and torch.equal(xs.grad, xe.grad))
        record(kind="check", op="ce_cuda_graph_fwd_bwd", ok=ok)
        log("CUDA graph CE fwd+bwd replay equal to eager:", ok)
    log("ce checks done")


# ------------------------------------------------------------------------------------------ sweeps
TOTAL = 2**28 if DEV == "cuda" else 2**12
NS = [262144, 131072, 65536, 32768, 1024, 4096, 16384, 8192, 2048] if DEV == "cuda" else [128, 2048]
compiled = {}


def torch_compiled(key, fn):
    if key not in compiled:
        compiled[key] = torch.compile(fn, dynamic=False)
    return compiled[key]


def fwd_variants(N, e=2):
    """Configs to time for rows of N (bf16)."""
    v = [None]
    if args.round == 1:
        warps = {1024: [1, 2, 4], 2048: [2, 4, 8], 4096: [4, 8, 16], 8192: [8, 16, 32], 16384: [8, 16, 32],
                 32768: [16, 32], 128: [1, 4]}
        for nw in warps.get(N, []):
            v.append(onecfg(N, nw))
        if N == 1024:
            v += [onecfg(N, 4, 4), onecfg(N, 8, 8), onecfg(N, 4, 8)]
        if N == 2048:
            v += [onecfg(N, 4, 2), onecfg(N, 8, 4)]
        if N >= 32768:
            for blk, nw, opts, pf in [(8192, 32, True, True), (16384, 32, True, True), (8192, 16, True, True),
                                      (4096, 16, True, True), (4096, 8, True, True), (8192, 32, True, False),
                                      (16384, 32, False, True), (16384, 16, True, False)]:
                v.append(loopcfg(blk, nw, opts, pf=pf))
        if N == 65536:
            v.append(onecfg(N, 32))
        if N >= 131072:
            v += [loopcfg(8192, 16, True, 2), loopcfg(8192, 16, True, 8), loopcfg(8192, 32, True, 4)]
    elif args.round >= 3:  # final: the default (team path for wide rows) against the previous default
        if N >= 16384:
            v += ["old"] + TEAM_EXTRA.get(N, [])
    else:  # round 2: the candidates round 1 left open (prefetch was not measured there)
        if N in (8192, 16384):
            v += [onecfg(N, N // 1024), onecfg(N, N // 512)]
        if N == 16384:
            v += [loopcfg(4096, 8), loopcfg(8192, 16)]
        if N >= 32768:
            v += [loopcfg(4096, 8), loopcfg(8192, 16), loopcfg(8192, 32), loopcfg(16384, 16),
                  loopcfg(8192, 8, pf=False)]
    out, seen = [], set()
    for c in v:
        k = cfg_name(c)
        if k not in seen:
            seen.add(k)
            out.append(c)
    return out


def sweep_softmax(dtype=torch.bfloat16, fwd_only_peers=False):
    e = torch.tensor([], dtype=dtype).element_size()
    for N in NS:
        if left() < 8:
            log("stop softmax sweep (time)")
            return
        M = max(TOTAL // N, 1)
        x = torch.randn(M, N, device=DEV, dtype=dtype)
        shape = f"{M}x{N}"
        nb = 2 * M * N * e
        for c in fwd_variants(N, e):
            def f(c=c):
                with override(N, c):
                    sm.softmax(x)
            timeit("softmax_fwd", "ours " + cfg_name(c), f, nb, shape=shape, N=N, cfg=cfg_name(c))
        timeit("softmax_fwd", "torch eager", lambda: torch.softmax(x, -1), nb, shape=shape, N=N)
        if liger_sm is not None:
            timeit("softmax_fwd", "liger", lambda: liger_sm(x), nb, shape=shape, N=N)
        if N in COMPILE_NS and left() > 25:
            cf = torch_compiled(("sm", N), lambda a: torch.softmax(a, -1))
            timeit("softmax_fwd", "torch.compile", lambda: cf(x), nb, shape=shape, N=N)
        # fwd+bwd through autograd (default config) and backward kernel variants
        xg = x.clone().requires_grad_()
        dy = torch.randn_like(x)

        def fb():
            xg.grad = None
            sm.softmax(xg).backward(dy)
        timeit("softmax_fwdbwd", "ours default", fb, 5 * M * N * e, shape=shape, N=N, cfg="default")

        def fbe():
            xg.grad = None
            torch.softmax(xg, -1).backward(dy)
        timeit("softmax_fwdbwd", "torch eager", fbe, 5 * M * N * e, shape=shape, N=N)
        if liger_sm is not None:
            def fbl():
                xg.grad = None
                liger_sm(xg).backward(dy)
            timeit("softmax_fwdbwd", "liger", fbl, 5 * M * N * e, shape=shape, N=N)
        if N in COMPILE_NS and left() > 25:
            cfb = torch_compiled(("smfb", N), lambda a: torch.softmax(a, -1))

            def fbc():
                xg.grad = None
                cfb(xg).backward(dy)
            timeit("softmax_fwdbwd", "torch.compile", fbc, 5 * M * N * e, shape=shape, N=N)
        y = torch.softmax(x, -1)
        if N >= 16384 and args.round >= 3:
            def fbo():
                with override(N, "old"):
                    xg.grad = None
                    sm.softmax(xg).backward(dy)
            timeit("softmax_fwdbwd", "ours " + cfg_name("old"), fbo, 5 * M * N * e, shape=shape, N=N, cfg="old")
        if args.round >= 3:
            bv = [None] + (["old"] if N >= 16384 else [])
        elif args.round == 1:
            bv = [None] + ([onecfg(N, 16), onecfg(N, 32)] if N * e <= 65536 and N >= 8192 else []) + \
                 ([loopcfg(8192, 32), loopcfg(16384, 32), loopcfg(8192, 16), loopcfg(4096, 8),
                   loopcfg(8192, 32, pf=False)] if N >= 32768 else [])
        else:
            bv = [None] + ([loopcfg(8192, 32), loopcfg(16384, 16), loopcfg(4096, 8)] if N >= 32768 else [])
        for c in bv:
            def b(c=c):
                with override(N, c):
                    S._softmax_bwd_impl(dy, y, 1, 1.0, False, False, dtype)
            timeit("softmax_bwd", "ours " + cfg_name(c), b, 3 * M * N * e, shape=shape, N=N, cfg=cfg_name(c))
        timeit("log_softmax_fwd", "ours default", lambda: sm.log_softmax(x), nb, shape=shape, N=N)
        timeit("log_softmax_fwd", "torch eager", lambda: torch.log_softmax(x, -1), nb, shape=shape, N=N)
        del x, xg, dy, y
        if DEV == "cuda":
            torch.cuda.empty_cache()


def sweep_few_rows():
    """Few wide rows (the split path): default (auto split) against one program per row."""
    for M, N in [(64, 262144), (8, 131072), (256, 65536)] if DEV == "cuda" else [(2, 8192)]:
        x = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
        shape = f"{M}x{N}"
        base = ORIG_PICK(N, 2, 32)
        for c in [None, "old", L.LaunchConfig(block_n=base.block_n, num_warps=base.num_warps, loop=base.loop,
                                       reverse=base.reverse, evict=base.evict, split=1)]:
            def f(c=c):
                with override(N, c):
                    sm.softmax(x)
            timeit("few_rows_fwd", "ours " + cfg_name(c), f, 2 * M * N * 2, shape=shape, N=N, cfg=cfg_name(c))
        timeit("few_rows_fwd", "torch eager", lambda: torch.softmax(x, -1), 2 * M * N * 2, shape=shape, N=N)
        xg = x.clone().requires_grad_()
        dy = torch.randn_like(x)

        def fb():
            xg.grad = None
            sm.softmax(xg).backward(dy)
        timeit("few_rows_fwdbwd", "ours default", fb, 5 * M * N * 2, shape=shape, N=N)

        def fbe():
            xg.grad = None
            torch.softmax(xg, -1).backward(dy)
        timeit("few_rows_fwdbwd", "torch eager", fbe, 5 * M * N * 2, shape=shape, N=N)


def sweep_ce():
    M, V = (8192, 128256) if DEV == "cuda" else (8, 4096)
    dtype = torch.bfloat16
    e = 2
    x = torch.randn(M, V, device=DEV, dtype=dtype)
    t = torch.randint(0, V, (M,), device=DEV)
    t[::10] = -100
    shape = f"{M}x{V}"
    nb = 2 * M * V * e
    xg = x.clone().requires_grad_()
    variants = [None]
    if args.round >= 3:
        variants += ["old"] + TEAM_EXTRA.get("ce", [])
    elif args.round > 1:
        variants += [loopcfg(b, w, o, pf=pf) for b, w, o, pf in [
            (8192, 32, True, True), (16384, 32, True, True), (8192, 16, True, True), (4096, 8, True, True),
            (4096, 4, True, True), (8192, 8, False, False)]]
    if args.round == 1:
        variants += [loopcfg(b, w, o, pf=pf) for b, w, o, pf in [
            (8192, 32, True, True), (16384, 32, True, True), (4096, 32, True, True), (8192, 16, True, True),
            (16384, 16, True, True), (8192, 8, True, True), (4096, 8, True, True), (8192, 32, True, False),
            (8192, 32, False, True), (16384, 16, True, False), (8192, 8, False, False)]]
    for c in variants:
        def f(c=c):
            with override(V, c):
                torch.autograd.grad(sm.cross_entropy(xg, t), xg)
        timeit("ce_fwdbwd", "ours " + cfg_name(c), f, nb, shape=shape, cfg=cfg_name(c))

    def f_leaf():
        xg.grad = None
        sm.cross_entropy(xg, t).backward()
    timeit("ce_fwdbwd", "ours default, .backward() into a leaf (.grad)", f_leaf, nb, shape=shape)

    def f_recompute():
        C.RECOMPUTE = True
        try:
            torch.autograd.grad(sm.cross_entropy(xg, t), xg)
        finally:
            C.RECOMPUTE = False
    timeit("ce_fwdbwd", "ours recompute mode (forward reads, backward reads + writes)", f_recompute, nb, shape=shape)

    def fwd_only():
        with torch.no_grad():
            sm.cross_entropy(x, t)
    timeit("ce_fwd", "ours forward only (no grad; bytes: read logits)", fwd_only, M * V * e, shape=shape)

    def f_eager():
        torch.autograd.grad(F.cross_entropy(xg, t), xg)
    timeit("ce_fwdbwd", "torch eager", f_eager, nb, shape=shape)

    def f_smooth():
        torch.autograd.grad(sm.cross_entropy(xg, t, label_smoothing=0.1, z_loss=1e-4), xg)
    timeit("ce_fwdbwd", "ours smoothing+z_loss", f_smooth, nb, shape=shape)
    if liger_ce is not None:
        xl = x.clone().requires_grad_()

        def f_liger():
            torch.autograd.grad(liger_ce(xl, t), xl)
        timeit("ce_fwdbwd", "liger", f_liger, nb, shape=shape)
        del xl
    if left() > 30:
        cf = torch.compile(lambda a, b: F.cross_entropy(a, b), dynamic=False)

        def f_comp():
            torch.autograd.grad(cf(xg, t), xg)
        timeit("ce_fwdbwd", "torch.compile", f_comp, nb, shape=shape)
    if left() > 25:
        ours_c = torch.compile(lambda a, b: sm.cross_entropy(a, b), dynamic=False, fullgraph=True)

        def f_oc():
            torch.autograd.grad(ours_c(xg, t), xg)
        timeit("ce_fwdbwd", "ours under torch.compile", f_oc, nb, shape=shape)
    del x, xg
    if DEV == "cuda":
        torch.cuda.empty_cache()


# round 3: extra team settings to time besides the default (filled in from round B)
TEAM_EXTRA = {16384: ["team 16384 8"], 65536: ["team 8192 4", "team 32768 16"],
              262144: ["team 8192 4", "team 32768 16"], "ce": ["team 8192 4", "team 32768 16"]}
COMPILE_NS = {32768} if args.round == 1 else {4096, 32768, 262144}
COMPILE_NS = COMPILE_NS if DEV == "cuda" else set()
skip = set(args.skip.split(","))
if "check" not in skip:
    safe("check_softmax", check_softmax)
    safe("check_ce", check_ce)
if "ce" not in skip:
    safe("sweep_ce", sweep_ce)
if "softmax" not in skip:
    safe("sweep_softmax", sweep_softmax)
if "few" not in skip:
    safe("sweep_few_rows", sweep_few_rows)
log("done")


# ------------------------------------------------------------------------------------------ report
def report():
    recs = [json.loads(line) for line in open(REC)]
    env = next((r for r in recs if r["kind"] == "env"), {})
    times = [r for r in recs if r["kind"] == "time"]
    checks = [r for r in recs if r["kind"] == "check"]
    errors = [r for r in recs if r["kind"] == "error"]

    def get(section, name, **match):
        for r in times:
            if r["section"] == section and r["name"] == name and all(r.get(k) == v for k, v in match.items()):
                return r
        return None

    def cell(r):
        return f"{r['gbps']:.0f} ({r['frac']:.0%})" if r else "—"

    lines = [f"# triton-softmax on the GPU, {time.strftime('%Y-%m-%d')}", "",
             f"{env.get('gpu')}, torch {env.get('torch')}, triton {env.get('triton')}; "
             f"device copy ceiling measured in the same run: **{COPY:.0f} GB/s**. "
             "Times are `triton.testing.do_bench` medians; GB/s counts the issue's effective bytes: softmax forward "
             "2·M·N·e (read x, write y), forward+backward 5·M·N·e, cross-entropy forward+backward 2·M·V·e "
             "(read logits, write the gradient once). Percentages are of the copy ceiling. Our numbers go through the "
             "public API (allocation and autograd included). Produced by `benchmarks/softmax_gpu_sweep.py`.", ""]
    ok = sum(1 for c in checks if c["ok"])
    lines += [f"## Correctness: {ok}/{len(checks)} checks pass", "",
              "| op | dtype | shape | options | result | max error |", "|---|---|---|---|---|---|"]
    for c in checks:
        err = ", ".join(f"{k}={c[k]:.3g}" for k in ("max_ulp", "grad_rel", "loss_rel", "vs_torch_grad_rel",
                                                     "equal_torch_frac") if k in c)
        lines.append(f"| {c['op']} | {c.get('dtype', '').replace('torch.', '')} | {c.get('shape', '')} | "
                     f"{c.get('kw', '')} | {'ok' if c['ok'] else '**FAIL**'} | {err} |")
    lines += ["", "max_ulp: output vs fp64 torch, in ulps of the dtype; grad_rel / loss_rel: max abs error over max "
              "|reference| (fp64 torch); vs_torch_grad_rel: against torch's own F.cross_entropy gradient in the same "
              "dtype; equal_torch_frac: fraction of outputs bitwise equal to torch's own kernel in the same dtype.", ""]
    for section, title in [("softmax_fwd", "Softmax forward, bf16, M·N = 2^28"),
                           ("softmax_fwdbwd", "Softmax forward + backward, bf16, M·N = 2^28"),
                           ("log_softmax_fwd", "Log-softmax forward, bf16, M·N = 2^28")]:
        Ns = sorted({r["N"] for r in times if r["section"] == section})
        lines += [f"## {title}", "", "| N | M | ours | previous (one program per row) | torch eager | torch.compile "
                  "| Liger | best variant (ours) |", "|---|---|---|---|---|---|---|---|"]
        for N in Ns:
            rows = [r for r in times if r["section"] == section and r["N"] == N]
            ours = [r for r in rows if r["name"].startswith("ours")]
            best = max(ours, key=lambda r: r["gbps"]) if ours else None
            lines.append(f"| {N} | {rows[0]['shape'].split('x')[0]} | {cell(get(section, 'ours default', N=N))} | "
                         f"{cell(get(section, 'ours ' + cfg_name('old'), N=N))} | "
                         f"{cell(get(section, 'torch eager', N=N))} | {cell(get(section, 'torch.compile', N=N))} | "
                         f"{cell(get(section, 'liger', N=N))} | "
                         f"{(best['name'][5:] + ' ' + cell(best)) if best else '—'} |")
        lines.append("")
    lines += ["## Cross-entropy forward + backward, 8192×128256 bf16 (Llama-3 vocabulary)", "",
              "| implementation | GB/s effective (% of copy) | time |", "|---|---|---|"]
    for r in [r for r in times if r["section"] in ("ce_fwdbwd", "ce_fwd")]:
        lines.append(f"| {r['name']} | "
                     f"{cell(r)} | {r['us']:.0f} µs |")
    few = [r for r in times if r["section"].startswith("few_rows")]
    if few:
        lines += ["", "## Few wide rows (team path; previous default: split over programs in two launches), bf16", "", "| pass | shape | implementation | GB/s |",
                  "|---|---|---|---|"]
        for r in few:
            lines.append(f"| {r['section'][9:]} | {r['shape']} | {r['name']} | {cell(r)} |")
    if errors:
        lines += ["", "## Errors", ""] + [f"- {e['name']}: {e['error']}" for e in errors]
    (OUT / "softmax_2026-11-30.md").write_text("\n".join(lines) + "\n")
    summary = {"env": env, "copy_gbps": COPY, "checks": checks, "times": times, "errors": errors}
    (OUT / "softmax_2026-11-30.json").write_text(json.dumps(summary, indent=1))
    log("report written")


safe("report", report)
