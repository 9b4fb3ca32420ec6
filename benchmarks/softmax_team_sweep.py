"""Team kernels for wide rows (issues 4 and 7): correctness on the GPU, then timing against the
one-program-per-row path and peers (softmax, cross-entropy, rms_norm, layer_norm).

python3 benchmarks/softmax_team_sweep.py --out DIR --part smoke|check|time --budget S [--only a,b] [--cpu]
python3 benchmarks/softmax_team_sweep.py --out DIR --report FILE.md   (tables from DIR/{check,time}.jsonl)

Records go to DIR/<part>.jsonl; the log to stdout. Bytes as in bench.py (softmax fwd 2MNe, fwd+bwd 5MNe,
bwd 3MNe, CE fwd+bwd 2MVe).
"""

import argparse
import contextlib
import copy
import json
import sys
import time
from pathlib import Path

from sweep_common import (Sweep, capture_cuda_graph, ce_ref, load_liger, load_packages, norm_grad_inputs, prepare,
                          ulp_diff)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--part", default="check")
ap.add_argument("--budget", type=float, default=60)
ap.add_argument("--cpu", action="store_true")
ap.add_argument("--only", default="", help="comma list of time sections: fwd,ce,fb,norms,normsbwd,bwd,few")
ap.add_argument("--report", default="", help="write a markdown report of DIR/check.jsonl + DIR/time.jsonl here")
ap.add_argument("--title", default="Team kernels for wide rows")
ap.add_argument("--final", action="store_true", help="time the shipped team settings and the looped path only")
args = ap.parse_args()
OUT = prepare(args.out, args.cpu)
RUN = Sweep(OUT / f"{args.part}.jsonl", args.budget, args.cpu, rep=15, min_left=4, err_chars=400, trace=True,
            widths=(13, 30, 14, 8, 6), json_default=str)
left, log, record, safe = RUN.left, RUN.log, RUN.record, RUN.safe

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

DEV = RUN.dev


def report(path):
    recs = []
    for part in ("check", "time"):
        f = OUT / f"{part}.jsonl"
        if f.exists():
            recs += [json.loads(line) for line in open(f)]
    copy = next((r["gbps"] for r in recs if r["kind"] == "copy"), float("nan"))
    checks = [r for r in recs if r["kind"] == "check"]
    times = [r for r in recs if r["kind"] == "time"]
    lines = [f"# {args.title}, {time.strftime('%Y-%m-%d')}", "",
             f"{torch.cuda.get_device_name() if DEV == 'cuda' else 'cpu'}, torch {torch.__version__}, triton "
             f"{triton.__version__}; copy ceiling in the same run **{copy:.0f} GB/s**. `triton.testing.do_bench` "
             "medians through the public API. Bytes: read x + write y (bf16), weight/bias once. Produced by "
             "`benchmarks/softmax_team_sweep.py`.", "",
             f"## Checks: {sum(1 for c in checks if c['ok'])}/{len(checks)} pass", "",
             "| op | shape | result | details |", "|---|---|---|---|"]
    for c in checks:
        det = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in c.items()
                        if k not in ("kind", "op", "shape", "ok", "t", "dtype", "kw"))
        lines.append(f"| {c['op']} {c.get('dtype', '').replace('torch.', '')} {c.get('kw', '') or ''} | "
                     f"{c.get('shape', '')} | {'ok' if c['ok'] else '**FAIL**'} | {det} |")
    for section in dict.fromkeys(r["section"] for r in times):
        lines += ["", f"## {section}", "", "| shape | implementation | µs | GB/s | % of copy |", "|---|---|---|---|---|"]
        for r in [r for r in times if r["section"] == section]:
            lines.append(f"| {r.get('shape', '')} | {r['name']} | {r['us']:.1f} | {r['gbps']:.0f} | {r['frac']:.0%} |")
    Path(path).write_text("\n".join(lines) + "\n")
    json_path = Path(path).with_suffix(".json")
    json_path.write_text(json.dumps({"copy_gbps": copy, "checks": checks, "times": times}, indent=1, default=str))
    log("report written", path)


if args.report:
    report(args.report)
    sys.exit(0)


sm, nm = load_packages(["triton-softmax", "triton-norms"], args.cpu)
W = sys.modules[nm.__name__ + "._wide"]
DEFAULT_WIDE = copy.deepcopy(W.WIDE_TUNED)  # entries may be lists of tiers (session 15)
if args.cpu:
    W.WIDE_ON_CPU = True
S = sys.modules[sm.__name__ + ".softmax"]
C = sys.modules[sm.__name__ + ".cross_entropy"]
L = sys.modules[sm.__name__ + "._launch"]
DEFAULT_TEAM = copy.deepcopy(L.TEAM_TUNED)
if args.cpu:
    L.TEAM_ON_CPU = True
    for k in L.TEAM_TUNED:
        L.TEAM_TUNED[k] = {"min_row_bytes": 1025, "chunk_bytes": 1024, "num_warps": 4, "programs_per_sm": 2, "maxnreg": 128}
    DEFAULT_TEAM = {k: dict(v) for k, v in L.TEAM_TUNED.items()}
    L.retuned()
log("loaded", sm.__name__, torch.__version__, triton.__version__, torch.cuda.get_device_name() if DEV == "cuda" else "cpu")

# count team launches (to make sure a check exercised the team path)
TEAM_LAUNCHES = [0]
_orig_phases = S._team_phases


def _counting_phases(device, team):
    TEAM_LAUNCHES[0] += 1
    return _orig_phases(device, team)


S._team_phases = _counting_phases
C._team_phases = _counting_phases


@contextlib.contextmanager
def team(kinds, cfg):
    """cfg: None = team path off (one program per row, the previous default); dict = TEAM_TUNED entry."""
    saved = {k: L.TEAM_TUNED.get(k) for k in kinds}
    for k in kinds:
        L.TEAM_TUNED[k] = cfg
    L.retuned()  # the softmax's launch plans follow the setting
    try:
        yield
    finally:
        L.TEAM_TUNED.update(saved)
        L.retuned()


def relerr(a, ref):
    a, ref = a.detach().double(), ref.detach().double()
    return float((a - ref).abs().max() / ref.abs().max().clamp(min=1e-30))


# ------------------------------------------------------------------------------------------ checks
def check_softmax():
    if DEV == "cuda":
        cases = [(torch.bfloat16, (8, 16385), False), (torch.bfloat16, (16, 65539), False),
                 (torch.bfloat16, (16, 65539), True), (torch.bfloat16, (4, 262144), False),
                 (torch.bfloat16, (4, 262144), True), (torch.bfloat16, (2048, 32768), False),
                 (torch.float16, (8, 100003), False), (torch.float32, (4, 131072), False),
                 (torch.float32, (4, 262147), True), (torch.bfloat16, (1, 524288), False)]
    else:
        cases = [(torch.bfloat16, (3, 2053), False), (torch.float32, (2, 1031), True)]
    for dtype, (M, N), lg in cases:
        n0 = TEAM_LAUNCHES[0]
        x = torch.randn(M, N, device=DEV, dtype=dtype) * 3
        f = sm.log_softmax if lg else sm.softmax
        tf = torch.log_softmax if lg else torch.softmax
        xg = x.clone().requires_grad_()
        y = f(xg)
        dy = torch.randn_like(x)
        y.backward(dy)
        ref = tf(x.double(), -1)
        # gradient reference: the fp64 formula on the kernel's own rounded output
        yd = y.detach().double()
        if lg:
            gref = dy.double() - yd.exp() * dy.double().sum(-1, keepdim=True)
        else:
            gref = yd * (dy.double() - (dy.double() * yd).sum(-1, keepdim=True))
        u = ulp_diff(y.detach(), ref, dtype)
        ge = relerr(xg.grad, gref)
        same = float((y.detach() == tf(x, -1)).float().mean())
        # determinism: a second run gives the same bits
        xg2 = x.clone().requires_grad_()
        y2 = f(xg2)
        y2.backward(dy)
        det = bool(torch.equal(y2, y) and torch.equal(xg2.grad, xg.grad))
        used = TEAM_LAUNCHES[0] - n0
        tol_g = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}[dtype]
        # team_calls counts team launch plans made (one per call signature, not per launch): the forward's at least
        ok = u <= (1.0 if dtype != torch.float32 else 64.0) and ge < tol_g and det and used >= 1
        if dtype == torch.bfloat16 and not lg and DEV == "cuda":
            ok = ok and same == 1.0
        record(kind="check", op="log_softmax" if lg else "softmax", dtype=str(dtype), shape=[M, N], max_ulp=u,
               grad_rel=ge, equal_torch_frac=same, deterministic=det, team_calls=used, ok=ok)
        log("check", "log_softmax" if lg else "softmax", dtype, (M, N), "ulp", u, "grad", f"{ge:.2e}", "eq_torch",
            same, "det", det, "team_calls", used, "OK" if ok else "FAIL")
    # scale + broadcast mask + non-last dim + causal on wide rows
    N = 40000 if DEV == "cuda" else 2053
    x = torch.randn(2, 3, N, device=DEV, dtype=torch.bfloat16)
    m = torch.randn(1, 1, N, device=DEV, dtype=torch.bfloat16)
    m[..., ::7] = float("-inf")
    y = sm.softmax(x, scale=0.7, mask=m)
    ref = torch.softmax(x.double() * 0.7 + m.double(), -1)
    u = ulp_diff(y, ref, torch.bfloat16)
    record(kind="check", op="softmax scale+mask", shape=list(x.shape), max_ulp=u, ok=u <= 1.0)
    log("check scale+mask ulp", u)
    xt = torch.randn(N, 5, device=DEV, dtype=torch.bfloat16)
    y = sm.softmax(xt, dim=0)
    u = ulp_diff(y, torch.softmax(xt.double(), 0), torch.bfloat16)
    record(kind="check", op="softmax dim=0", shape=list(xt.shape), max_ulp=u, ok=u <= 1.0)
    log("check dim=0 ulp", u)
    xc = torch.randn(1, 4, N, device=DEV, dtype=torch.bfloat16)  # causal: rows 0..3 of a (4, N) score block
    y = sm.softmax(xc, causal=True)
    keep = torch.ones(4, N, device=DEV, dtype=torch.bool).tril()
    ref = torch.softmax(xc.double().masked_fill(~keep, float("-inf")), -1)
    u = ulp_diff(y, ref, torch.bfloat16)
    record(kind="check", op="softmax causal", shape=list(xc.shape), max_ulp=u, ok=u <= 1.0)
    log("check causal ulp", u)


def check_ce():
    shapes = [(64, 128256), (16, 262144), (33, 50257)] if DEV == "cuda" else [(3, 2053)]
    for dtype in (torch.bfloat16, torch.float32):
        for M, V in shapes if dtype == torch.bfloat16 else shapes[:1]:
            x = torch.randn(M, V, device=DEV, dtype=dtype) * 2
            t = torch.randint(0, V, (M,), device=DEV)
            t[::5] = -100
            for kw in ({}, {"label_smoothing": 0.1}, {"z_loss": 1e-4, "reduction": "sum"}, {"reduction": "none"}):
                n0 = TEAM_LAUNCHES[0]
                xg = x.clone().requires_grad_()
                loss = sm.cross_entropy(xg, t, **kw)
                dl = torch.randn(loss.shape, device=DEV) if loss.dim() else None
                loss.backward(dl)
                xr = x.double().requires_grad_()
                ref = ce_ref(xr, t, **dict(kw))
                ref.backward(dl.double() if dl is not None else None)
                le, ge = relerr(loss, ref), relerr(xg.grad, xr.grad)
                tol = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}[dtype]
                entry = dict(kind="check", op="cross_entropy", dtype=str(dtype), shape=[M, V], kw=kw, loss_rel=le,
                             grad_rel=ge, team_calls=TEAM_LAUNCHES[0] - n0)
                if "z_loss" not in kw:
                    tx = x.clone().requires_grad_()
                    tl_ = F.cross_entropy(tx, t, **kw)
                    tl_.backward(dl)
                    entry["vs_torch_loss_rel"] = relerr(loss, tl_)
                    entry["vs_torch_grad_rel"] = relerr(xg.grad, tx.grad)
                xg2 = x.clone().requires_grad_()
                loss2 = sm.cross_entropy(xg2, t, **kw)
                loss2.backward(dl)
                entry["deterministic"] = bool(torch.equal(loss2, loss) and torch.equal(xg2.grad, xg.grad))
                entry["ok"] = le < tol and ge < tol and entry["deterministic"] and entry["team_calls"] >= 1
                record(**entry)
                log("check ce", dtype, (M, V), kw, f"loss {le:.2e} grad {ge:.2e}",
                    {k: v for k, v in entry.items() if k.startswith("vs") or k in ("deterministic", "team_calls")},
                    "OK" if entry["ok"] else "FAIL")
    # no-grad forward (inference) and recompute mode
    M, V = shapes[0]
    x = torch.randn(M, V, device=DEV, dtype=torch.bfloat16)
    t = torch.randint(0, V, (M,), device=DEV)
    with torch.no_grad():
        le = relerr(sm.cross_entropy(x, t), ce_ref(x, t))
    record(kind="check", op="ce no-grad", loss_rel=le, ok=le < 1.6e-2)
    log("check ce no-grad", le)


def check_graphs():
    if DEV != "cuda":
        return
    # CUDA graph: softmax fwd+bwd and CE fwd+bwd on the team path, replayed on new data
    x = torch.randn(64, 65536, device=DEV, dtype=torch.bfloat16).requires_grad_()
    dy = torch.randn(64, 65536, device=DEV, dtype=torch.bfloat16)
    xs = torch.randn(256, 128256, device=DEV, dtype=torch.bfloat16).requires_grad_()
    ts = torch.randint(0, 128256, (256,), device=DEV)

    def step():
        yg = sm.softmax(x)
        yg.backward(dy)
        lg = sm.cross_entropy(xs, ts, label_smoothing=0.1)
        lg.backward()
        return yg, lg

    def reset():
        x.grad = None
        xs.grad = None
    g, (yg, lg) = capture_cuda_graph(step, reset)
    nx, nxs = torch.randn_like(x), torch.randn_like(xs)
    with torch.no_grad():
        x.copy_(nx)
        xs.copy_(nxs)
    x.grad.zero_()
    xs.grad.zero_()
    for _ in range(3):
        g.replay()  # replays reuse the graph's zeroed counters (memset inside the graph)
    torch.cuda.synchronize()
    xe = nx.clone().requires_grad_()
    ye = sm.softmax(xe)
    ye.backward(dy)
    xse = nxs.clone().requires_grad_()
    le = sm.cross_entropy(xse, ts, label_smoothing=0.1)
    le.backward()
    ok = bool(torch.equal(yg, ye) and torch.equal(lg, le) and torch.equal(xs.grad, xse.grad))
    # x.grad accumulates over 3 replays? no: the graph writes .grad in place only on the first allocation
    record(kind="check", op="cuda_graph team fwd+bwd", ok=ok, x_grad_equal=bool(torch.equal(x.grad, xe.grad)))
    log("check CUDA graph (softmax + CE, team path) equal to eager:", ok, "x.grad", bool(torch.equal(x.grad, xe.grad)))
    # torch.compile fullgraph
    xc = torch.randn(128, 131072, device=DEV, dtype=torch.bfloat16)
    fc = torch.compile(lambda a: sm.softmax(a), fullgraph=True, dynamic=False)
    ok = bool(torch.equal(fc(xc), sm.softmax(xc)))
    record(kind="check", op="torch.compile fullgraph softmax team", ok=ok)
    log("check compile fullgraph:", ok)


@contextlib.contextmanager
def wide(cfg, kinds=None):
    saved = dict(W.WIDE_TUNED)
    for k in kinds or [k for k in W.WIDE_TUNED if not k.endswith("_bwd")]:
        W.WIDE_TUNED[k] = cfg
    try:
        yield
    finally:
        W.WIDE_TUNED.update(saved)


def check_norms():
    shapes = [(64, 65536), (16, 262144), (33, 100003)] if DEV == "cuda" else [(3, 32771)]
    for M, N in shapes:
        x = torch.randn(M, N, device=DEV, dtype=torch.bfloat16) * 2 + 0.5
        r = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
        w = torch.randn(N, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(N, device=DEV, dtype=torch.bfloat16)
        cases = {
            "rms_norm": lambda: nm.rms_norm(x, w, eps=1e-6),
            "rms_norm no weight": lambda: nm.rms_norm(x, eps=1e-6),
            "add_rms_norm": lambda: nm.add_rms_norm(x, r, w, eps=1e-6),
            "layer_norm": lambda: nm.layer_norm(x, w, b, eps=1e-5),
            "add_layer_norm": lambda: nm.add_layer_norm(x, r, w, b, eps=1e-5),
        }
        refs = {
            "rms_norm": lambda: F.rms_norm(x.double(), (N,), w.double(), 1e-6),
            "rms_norm no weight": lambda: F.rms_norm(x.double(), (N,), None, 1e-6),
            "layer_norm": lambda: F.layer_norm(x.double(), (N,), w.double(), b.double(), 1e-5),
        }
        for name, f in cases.items():
            n0 = TEAM_LAUNCHES_W[0]
            out = f()
            used = TEAM_LAUNCHES_W[0] - n0
            out2 = f()
            with wide(None):
                old = f()
            outs, outs2, olds = [o if isinstance(o, tuple) else (o,) for o in (out, out2, old)]
            det = all(torch.equal(a, c) for a, c in zip(outs, outs2))
            diff_old = max(float((a.float() - c.float()).abs().max()) for a, c in zip(outs, olds))
            eq_old = min(float((a == c).float().mean()) for a, c in zip(outs, olds))
            entry = dict(kind="check", op=name, shape=[M, N], deterministic=det, team_calls=used,
                         max_diff_vs_looped=diff_old, equal_looped_frac=eq_old)
            if name in refs:
                ref = refs[name]()
                entry["max_abs_err_fp64"] = float((outs[0].double() - ref).abs().max())
                entry["looped_max_abs_err_fp64"] = float((olds[0].double() - ref).abs().max())
            # as accurate as the looped kernel: error vs fp64 within that kernel's error + 1 bf16 ulp of |y|max
            ok = det and used >= 1 and diff_old <= 2 ** -7 * float(outs[0].float().abs().max())
            entry["ok"] = ok
            record(**entry)
            log("check", name, (M, N), {k: (round(v, 6) if isinstance(v, float) else v) for k, v in entry.items()
                                         if k not in ("kind", "op", "shape", "ok")}, "OK" if ok else "FAIL")
    # backward through a team forward (saved statistics written by member 0)
    M, N = shapes[0]
    x = (torch.randn(M, N, device=DEV, dtype=torch.float32) * 2 + 0.5).requires_grad_()
    w = torch.randn(N, device=DEV, dtype=torch.float32).requires_grad_()
    y = nm.layer_norm(x, w, None, eps=1e-5)
    y.backward(torch.ones_like(y))
    xr = x.detach().double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    F.layer_norm(xr, (N,), wr, None, 1e-5).backward(torch.ones(M, N, device=DEV, dtype=torch.float64))
    ge = relerr(x.grad, xr.grad)
    we = relerr(w.grad, wr.grad)
    record(kind="check", op="layer_norm fp32 backward after team forward", grad_rel=ge, w_grad_rel=we,
           ok=ge < 1e-4 and we < 1e-4)
    log("check ln backward after team fwd", ge, we)


TEAM_LAUNCHES_W = [0]
_orig_w = W.team_phases


def _count_w(device, team):
    TEAM_LAUNCHES_W[0] += 1
    return _orig_w(device, team)


W.team_phases = _count_w


def time_norms():
    liger_rms = None
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        liger_rms = LigerRMSNormFunction.apply
    except Exception as e:  # noqa: BLE001
        log("no liger rms", e)
    for kind, M, N in ([("rms_norm", 4096, 65536), ("rms_norm", 1024, 262144), ("layer_norm", 4096, 65536),
                        ("layer_norm", 1024, 262144)] if DEV == "cuda" else [("rms_norm", 4, 32771)]):
        if left() < 6:
            return
        x = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
        w = torch.randn(N, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(N, device=DEV, dtype=torch.bfloat16)
        nb = 4 * M * N + 4 * N
        f = (lambda: nm.rms_norm(x, w, eps=1e-6)) if kind == "rms_norm" else (lambda: nm.layer_norm(x, w, b))
        shape = f"{M}x{N}"
        variants = [DEFAULT_WIDE[kind], pcfg(8192, 4, 8, 64), pcfg(4096, 2, 12, 80), pcfg(4096, 4, 8, 64),
                    pcfg(16384, 8, 4, 64), pcfg(16384, 8, 3, 80), pcfg(8192, 4, 5, 96), pcfg(8192, 4, 4, 128), None]
        for c in [DEFAULT_WIDE[kind], None] if args.final else variants:
            with wide(c):
                timeit(kind + "_fwd", tname(c), f, nb, shape=shape, N=N, cfg=c)
        if kind == "rms_norm":
            timeit(kind + "_fwd", "F.rms_norm", lambda: F.rms_norm(x, (N,), w, 1e-6), nb, shape=shape, N=N)
            comp = torch.compile(lambda a, c: F.rms_norm(a, (N,), c, 1e-6))
            timeit(kind + "_fwd", "torch.compile", lambda: comp(x, w), nb, shape=shape, N=N)
            if liger_rms is not None:
                timeit(kind + "_fwd", "liger", lambda: liger_rms(x, w, 1e-6), nb, shape=shape, N=N)
        else:
            timeit(kind + "_fwd", "F.layer_norm", lambda: F.layer_norm(x, (N,), w, b), nb, shape=shape, N=N)
            comp = torch.compile(lambda a, c, d: F.layer_norm(a, (N,), c, d))
            timeit(kind + "_fwd", "torch.compile", lambda: comp(x, w, b), nb, shape=shape, N=N)
        del x


def time_norms_bwd():
    """Backward alone of the wide-row norms (x, dy read, dx written: 3 tensors; dw, db partials aside)."""
    for kind, M, N in ([("rms_norm", 4096, 65536), ("rms_norm", 1024, 262144), ("layer_norm", 4096, 65536)]
                       if DEV == "cuda" else [("rms_norm", 4, 32771)]):
        if left() < 6:
            return
        x, w, b, dy, ins = norm_grad_inputs(kind, M, N, DEV)
        f = (lambda: nm.rms_norm(x, w, eps=1e-6, cast_dtype=x.dtype)) if kind == "rms_norm" \
            else (lambda: nm.layer_norm(x, w, b))
        shape = f"{M}x{N}"
        variants = [DEFAULT_WIDE[kind + "_bwd"], pcfg(4096, 4, 4, 128), pcfg(8192, 4, 3, 168), pcfg(4096, 2, 8, 128),
                    pcfg(16384, 8, 2, 128), None]
        for c in [DEFAULT_WIDE[kind + "_bwd"], None] if args.final else variants:
            with wide(c, [kind + "_bwd"]):
                y = f()
                timeit(kind + "_bwd", tname(c), lambda: torch.autograd.grad(y, ins, dy, retain_graph=True), 6 * M * N,
                       shape=shape, N=N, cfg=c)

                def fb():
                    for t in ins:
                        t.grad = None
                    f().backward(dy)
                timeit(kind + "_fwdbwd", tname(c), fb, 10 * M * N, shape=shape, N=N, cfg=c)
        peer = torch.compile((lambda a, c: F.rms_norm(a, (N,), c, 1e-6)) if kind == "rms_norm"
                             else (lambda a, c: F.layer_norm(a, (N,), c, None)))
        yc = peer(x, w)
        timeit(kind + "_bwd", "torch.compile", lambda: torch.autograd.grad(yc, (x, w), dy, retain_graph=True),
               6 * M * N, shape=shape, N=N)
        del x, dy


# ------------------------------------------------------------------------------------------ timing
def timeit(section, name, fn, nbytes, **extra):
    return RUN.timeit(section, name, fn, nbytes, need=3, **extra)


def pcfg(chunk, warps, per_sm, maxnreg, min_bytes=65537):
    """A persistent-team setting (``_launch.TEAM_TUNED``, ``_wide.WIDE_TUNED``)."""
    return {"min_row_bytes": min_bytes, "chunk_bytes": chunk, "num_warps": warps, "programs_per_sm": per_sm,
            "maxnreg": maxnreg}


def tname(c):
    if c is None:
        return "old (1 program/row)"
    name = f"team {c['chunk_bytes'] // 1024}K w{c['num_warps']}"
    return name + (f" x{c['programs_per_sm']}/SM r{c['maxnreg']}" if "maxnreg" in c else "")


liger_sm, liger_ce = load_liger(log)

TOTAL = 2**28 if DEV == "cuda" else 2**13
NS = [65536, 262144, 32768, 131072, 16384] if DEV == "cuda" else [2048, 4096]
FWD_VARIANTS = [pcfg(16384, 4, 4, 128, 1), pcfg(4096, 2, 12, 80, 1), pcfg(8192, 4, 6, 80, 1), pcfg(8192, 4, 5, 96, 1),
                pcfg(32768, 8, 2, 128, 1), None]
BWD_VARIANTS = [pcfg(16384, 4, 4, 128, 1), pcfg(8192, 4, 4, 128, 1), pcfg(4096, 2, 12, 80, 1), pcfg(8192, 4, 6, 80, 1),
                pcfg(16384, 8, 2, 128, 1), None]
CE_VARIANTS = [pcfg(16384, 4, 4, 128), pcfg(8192, 4, 5, 96), pcfg(8192, 4, 6, 80), pcfg(4096, 2, 12, 80),
               pcfg(8192, 4, 4, 128), None]
if args.final:  # the shipped settings against the looped path only
    FWD_VARIANTS, BWD_VARIANTS, CE_VARIANTS = [DEFAULT_TEAM["softmax"], None], [DEFAULT_TEAM["softmax_bwd"], None], [None]
SEC = set(args.only.split(",")) if args.only else {"fwd", "ce", "fb", "norms", "bwd", "few"}


def row_sweep():
    """(M, N, x, shape) for each row width N of NS while at least 6 s of the budget are left: x a fresh bf16
    (M, N) normal tensor, M * N = TOTAL, shape = "MxN"."""
    for N in NS:
        if left() < 6:
            return
        M = TOTAL // N
        yield M, N, torch.randn(M, N, device=DEV, dtype=torch.bfloat16), f"{M}x{N}"


def time_softmax_fwd():
    for M, N, x, shape in row_sweep():
        for c in FWD_VARIANTS:
            with team(["softmax"], c):
                timeit("softmax_fwd", tname(c), lambda: sm.softmax(x), 4 * M * N, shape=shape, N=N, cfg=c)
        timeit("softmax_fwd", "torch eager", lambda: torch.softmax(x, -1), 4 * M * N, shape=shape, N=N)
        if liger_sm is not None and N <= 65536:
            timeit("softmax_fwd", "liger", lambda: liger_sm(x), 4 * M * N, shape=shape, N=N)
        del x


def time_softmax_bwd():
    for M, N, x, shape in row_sweep():
        y = torch.softmax(x, -1)
        dy = torch.randn_like(x)
        for c in BWD_VARIANTS:
            with team(["softmax_bwd"], c):
                timeit("softmax_bwd", tname(c), lambda: S._softmax_bwd_impl(dy, y, 1, 1.0, False, False, x.dtype),
                       6 * M * N, shape=shape, N=N, cfg=c)
        del x, y, dy


def time_fwdbwd():
    for M, N, x, shape in row_sweep():
        x.requires_grad_()
        dy = torch.randn_like(x)

        def fb():
            x.grad = None
            sm.softmax(x).backward(dy)
        timeit("softmax_fwdbwd", "ours default (team)", fb, 10 * M * N, shape=shape, N=N)
        with team(["softmax", "softmax_bwd"], None):
            timeit("softmax_fwdbwd", "old (1 program/row)", fb, 10 * M * N, shape=shape, N=N)
        if liger_sm is not None and N <= 65536:
            def fbl():
                x.grad = None
                liger_sm(x).backward(dy)
            timeit("softmax_fwdbwd", "liger", fbl, 10 * M * N, shape=shape, N=N)

        def fbe():
            x.grad = None
            torch.softmax(x, -1).backward(dy)
        timeit("softmax_fwdbwd", "torch eager", fbe, 10 * M * N, shape=shape, N=N)
        del x, dy


def time_ce():
    M, V = (8192, 128256) if DEV == "cuda" else (8, 4096)
    x = torch.randn(M, V, device=DEV, dtype=torch.bfloat16).requires_grad_()
    t = torch.randint(0, V, (M,), device=DEV)
    t[::10] = -100
    shape = f"{M}x{V}"
    for c in CE_VARIANTS:
        with team(["cross_entropy"], c):
            timeit("ce_fwdbwd", tname(c), lambda: torch.autograd.grad(sm.cross_entropy(x, t), x), 4 * M * V,
                   shape=shape, cfg=c)
    with torch.no_grad():
        timeit("ce_fwd", "ours default, no grad (read only)", lambda: sm.cross_entropy(x, t), 2 * M * V, shape=shape)
    timeit("ce_fwdbwd", "ours smoothing+z_loss", lambda: torch.autograd.grad(
        sm.cross_entropy(x, t, label_smoothing=0.1, z_loss=1e-4), x), 4 * M * V, shape=shape)
    if liger_ce is not None:
        timeit("ce_fwdbwd", "liger", lambda: torch.autograd.grad(liger_ce(x, t), x), 4 * M * V, shape=shape)
    timeit("ce_fwdbwd", "torch eager", lambda: torch.autograd.grad(F.cross_entropy(x, t), x), 4 * M * V, shape=shape)


def time_few():
    for M, N in [(64, 262144), (8, 131072), (1, 262144)] if DEV == "cuda" else [(2, 4096)]:
        x = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
        for c in [DEFAULT_TEAM["softmax"], None]:
            with team(["softmax"], c):
                timeit("few_rows_fwd", tname(c), lambda: sm.softmax(x), 4 * M * N, shape=f"{M}x{N}", N=N)
        timeit("few_rows_fwd", "torch eager", lambda: torch.softmax(x, -1), 4 * M * N, shape=f"{M}x{N}", N=N)


if args.part == "smoke":  # one call of each team kernel (a hang shows as a timeout of this step)
    xs = torch.randn(64, 65536, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    sm.softmax(xs).backward(torch.ones_like(xs))
    xc = torch.randn(64, 128256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    sm.cross_entropy(xc, torch.randint(0, 128256, (64,), device=DEV)).backward()
    nm.rms_norm(torch.randn(8, 65536, device=DEV, dtype=torch.bfloat16))
    nm.layer_norm(torch.randn(8, 65536, device=DEV, dtype=torch.bfloat16))
    if DEV == "cuda":
        torch.cuda.synchronize()
    ok = torch.equal(sm.softmax(xs.detach()), torch.softmax(xs.detach(), -1))
    print("SMOKE OK" if ok else "SMOKE MISMATCH", TEAM_LAUNCHES[0], TEAM_LAUNCHES_W[0], flush=True)
elif args.part == "check":
    CHK = set(args.only.split(",")) if args.only else {"softmax", "ce", "norms", "graphs"}
    for name, fn in [("softmax", check_softmax), ("ce", check_ce), ("norms", check_norms), ("graphs", check_graphs)]:
        if name in CHK:
            safe("check_" + name, fn)
else:
    if DEV == "cuda":
        RUN.copy_ceiling()
    for name, fn in [("fwd", time_softmax_fwd), ("ce", time_ce), ("fb", time_fwdbwd), ("norms", time_norms),
                     ("normsbwd", time_norms_bwd), ("bwd", time_softmax_bwd), ("few", time_few)]:
        if name in SEC:
            safe(name, fn)
log("done", args.part)
