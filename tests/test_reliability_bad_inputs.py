"""The bad-input catalog: what a user can hand each op, and what they get back.

Every row is (package fixture, id, call, expected exception type, words the message must hold):
wrong dtypes (int, fp8, fp64), tensors on different devices (``meta`` stands for the other device on
a CPU-only machine, the CPU on a GPU one), mismatched weight/bias/residual/target/out shapes, odd
last dims for gated ops, non-tensor arguments, bad scalars (negative / NaN / infinite eps,
thresholds, scales, label smoothing, z-loss), unknown option strings. Each must raise a clear
error that names the argument, before any kernel runs; never a crash, a hang or a wrong value.

Values that are not errors must equal PyTorch's: empty tensors (0 rows, 0 columns) give PyTorch's
result (shape, dtype, values), and NaN / +inf / -inf propagate to the same positions as PyTorch's
own ops (the eager RMSNorm formula, and on CUDA ``F.rms_norm`` for ``torch_order="fused"``;
``F.layer_norm``, ``F.silu``..., ``torch.softmax``, ``F.cross_entropy``, ``F.linear``); GELU against
fp64, because torch's CPU fp32/bf16 GELU returns NaN for +inf where fp64 and CUDA return +inf.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.nn.functional as F

INT = torch.int32
FP8 = getattr(torch, "float8_e4m3fn", torch.int8)


def other_device(device: str) -> str:
    return "cpu" if device == "cuda" else "meta"


def r(*shape, device, dtype=torch.float32):
    return torch.randn(shape, device="cpu").to(dtype).to(device)


# (fixture, id, call(pkg, device), exception type, words the message must contain)
CATALOG = []


PENDING = {  # id -> reason: known gaps not fixed yet (strict xfail: a fix turns them into failures to remove)
}


def bad(fixture, case_id, exc, words):
    def deco(f):
        case = f"{fixture}-{case_id}"
        marks = [pytest.mark.xfail(strict=True, reason=PENDING[case])] if case in PENDING else []
        CATALOG.append(pytest.param(fixture, f, exc, words, id=case, marks=marks))
        return f
    return deco


# ----------------------------------------------------------------------------- norms
N = 37
for _name in ("rms_norm", "layer_norm"):
    def _f(pkg, name=_name):
        return getattr(pkg, name)
    bad("norms", f"{_name}-x-int", TypeError, ["x", "dtype"])(
        lambda p, d, f=_f: f(p)(torch.ones(2, N, dtype=INT, device=d), None))
    bad("norms", f"{_name}-x-fp8", TypeError, ["x", "dtype"])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d).to(FP8), None))
    bad("norms", f"{_name}-x-fp64", TypeError, ["x", "dtype"])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d, dtype=torch.float64), None))
    bad("norms", f"{_name}-x-list", TypeError, ["x", "Tensor"])(lambda p, d, f=_f: f(p)([[1.0, 2.0]], None))
    bad("norms", f"{_name}-x-none", TypeError, ["x", "Tensor"])(lambda p, d, f=_f: f(p)(None, None))
    bad("norms", f"{_name}-x-0d", ValueError, ["x", "dimension"])(lambda p, d, f=_f: f(p)(r(device=d), None))
    bad("norms", f"{_name}-weight-int", TypeError, ["weight", "dtype"])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d), torch.ones(N, dtype=INT, device=d)))
    bad("norms", f"{_name}-weight-numpy", TypeError, ["weight", "Tensor"])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d), r(N, device="cpu").numpy()))
    bad("norms", f"{_name}-weight-shape", ValueError, ["weight", "shape", str(N)])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d), r(N + 1, device=d)))
    bad("norms", f"{_name}-weight-2d", ValueError, ["weight", "shape"])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d), r(1, N, device=d)))
    bad("norms", f"{_name}-bias-shape", ValueError, ["bias", "shape"])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d), r(N, device=d), r(N - 1, device=d)))
    bad("norms", f"{_name}-weight-device", ValueError, ["weight", "device"])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d), r(N, device=other_device(d))))
    bad("norms", f"{_name}-bias-device", ValueError, ["bias", "device"])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d), r(N, device=d), r(N, device=other_device(d))))
    bad("norms", f"{_name}-eps-negative", ValueError, ["eps", ">= 0"])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d), None, None, -1e-6))
    bad("norms", f"{_name}-eps-nan", ValueError, ["eps"])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d), None, None, math.nan))
    bad("norms", f"{_name}-eps-inf", ValueError, ["eps"])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d), None, None, math.inf))
    bad("norms", f"{_name}-eps-tensor", TypeError, ["eps"])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d), None, None, torch.tensor(1e-5)))
    bad("norms", f"{_name}-eps-str", TypeError, ["eps"])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d), None, None, "1e-5"))
    bad("norms", f"{_name}-torch_order-unknown", ValueError, ["torch_order"])(
        lambda p, d, f=_f: f(p)(r(2, N, device=d), None, torch_order="cuda"))



# A sparse or nested tensor anywhere: the plain-inference fast paths build their plan keys from strides and data
# pointers, which such tensors lack (RuntimeError: "Cannot access data pointer", "NestedTensorImpl doesn't support
# sizes"); the checks name the argument instead. Strided nested tensors (torch.nested.nested_tensor's default).
def _sparse(t):
    return t.to_sparse()


def _nested(t):
    return torch.nested.nested_tensor([t, t[:1]])


def _x(d, n=N, dtype=torch.float32):
    return r(2, n, device=d, dtype=dtype)


for _kind, _make in (("sparse", _sparse), ("nested", _nested)):
    for _grad in (False, True):  # inference, and training (the eager autograd route)
        _g = "-grad" if _grad else ""

        def _t(t, grad=_grad):
            return t.requires_grad_() if grad else t
        bad("norms", f"rms_norm-x-{_kind}{_g}", TypeError, ["x", _kind])(
            lambda p, d, m=_make, t=_t: p.rms_norm(t(m(_x(d))), r(N, device=d)))
        bad("norms", f"layer_norm-x-{_kind}{_g}", TypeError, ["x", _kind])(
            lambda p, d, m=_make, t=_t: p.layer_norm(t(m(_x(d))), r(N, device=d)))
    bad("norms", f"rms_norm-weight-{_kind}", TypeError, ["weight", _kind])(
        lambda p, d, m=_make: p.rms_norm(_x(d), m(r(N, device=d))))
    bad("norms", f"add_rms_norm-residual-{_kind}", TypeError, ["residual", _kind])(
        lambda p, d, m=_make: p.add_rms_norm(_x(d), m(_x(d)), r(N, device=d)))
    bad("norms", f"add_rms_norm-x-{_kind}", TypeError, ["x", _kind])(
        lambda p, d, m=_make: p.add_rms_norm(m(_x(d)), _x(d), r(N, device=d), torch_order="mean"))
    bad("softmax", f"softmax-x-{_kind}", TypeError, ["x", _kind])(lambda p, d, m=_make: p.softmax(m(_x(d))))
    bad("softmax", f"log_softmax-mask-{_kind}", TypeError, ["mask", _kind])(
        lambda p, d, m=_make: p.log_softmax(_x(d), mask=m(_x(d))))
    bad("softmax", f"cross_entropy-logits-{_kind}", TypeError, ["logits", _kind])(
        lambda p, d, m=_make: p.cross_entropy(m(_x(d)), torch.zeros(2, dtype=torch.long, device=d)))
    bad("softmax", f"cross_entropy-target-{_kind}", TypeError, ["target", _kind])(
        lambda p, d, m=_make: p.cross_entropy(_x(d), m(torch.zeros(2, dtype=torch.long, device=d))))
    bad("activations", f"silu_and_mul-x-{_kind}", TypeError, ["x", _kind])(
        lambda p, d, m=_make: p.silu_and_mul(m(_x(d, 38))))
    bad("activations", f"act_and_mul-up-{_kind}", TypeError, ["up", _kind])(
        lambda p, d, m=_make: p.act_and_mul(_x(d), m(_x(d))))
    bad("matmul", f"matmul-a-{_kind}", TypeError, ["a", _kind])(
        lambda p, d, m=_make: p.matmul(m(r(3, 8, device=d, dtype=H)), r(8, 4, device=d, dtype=H)))
    bad("matmul", f"matmul-bias-{_kind}", TypeError, ["bias", _kind])(
        lambda p, d, m=_make: p.matmul(r(3, 8, device=d, dtype=H), r(8, 4, device=d, dtype=H),
                                       m(r(4, device=d, dtype=H))))
    bad("attention", f"flash_attention-k-{_kind}", TypeError, ["k", _kind])(
        lambda p, d, m=_make: p.flash_attention(r(1, 2, 5, 16, device=d, dtype=H), m(r(1, 2, 5, 16, device=d, dtype=H)),
                                                r(1, 2, 5, 16, device=d, dtype=H)))
    bad("attention", f"rotary_embedding-x-{_kind}", TypeError, ["x", _kind])(
        lambda p, d, m=_make: p.rotary_embedding(m(r(1, 5, 2, 16, device=d)), r(5, 16, device=d), r(5, 16, device=d)))
    bad("attention", f"apply_rotary_pos_emb-cos-{_kind}", TypeError, ["cos", _kind])(
        lambda p, d, m=_make: p.apply_rotary_pos_emb(r(1, 2, 5, 16, device=d), r(1, 2, 5, 16, device=d),
                                                     m(r(1, 5, 16, device=d)), r(1, 5, 16, device=d)))

# flags and scalars that an unchecked bool() or a bare torch call would take silently or name vaguely: a string
# "false" read as True (interleaved, fp32_math, eager_rounding), a NaN scale (a value, not a type), unsqueeze_dim
_qkv = (lambda d: [r(1, 2, 5, 16, device=d, dtype=H) for _ in range(3)])
bad("attention", "flash_attention-scale-nan", ValueError, ["scale", "finite"])(
    lambda p, d: p.flash_attention(*_qkv(d), scale=float("nan")))
bad("attention", "flash_attention-scale-str", TypeError, ["scale", "str"])(
    lambda p, d: p.flash_attention(*_qkv(d), scale="0.1"))
bad("attention", "flash_attention_rope-interleaved-str", TypeError, ["interleaved", "bool"])(
    lambda p, d: p.flash_attention_rope(*_qkv(d), r(5, 16, device=d), r(5, 16, device=d), interleaved="false"))
bad("attention", "rotary_embedding-interleaved-str", TypeError, ["interleaved", "bool"])(
    lambda p, d: p.rotary_embedding(r(1, 5, 2, 16, device=d), r(5, 1, 16, device=d), r(5, 1, 16, device=d),
                                    interleaved="false"))
bad("attention", "rotary_embedding-fp32_math-int", TypeError, ["fp32_math", "bool"])(
    lambda p, d: p.rotary_embedding(r(1, 5, 2, 16, device=d), r(5, 1, 16, device=d), r(5, 1, 16, device=d),
                                    fp32_math=1))
bad("attention", "apply_rotary_pos_emb-unsqueeze_dim-range", IndexError, ["unsqueeze_dim", "[-4, 3]"])(
    lambda p, d: p.apply_rotary_pos_emb(r(1, 2, 5, 16, device=d), r(1, 2, 5, 16, device=d), r(1, 5, 16, device=d),
                                        r(1, 5, 16, device=d), 5))
bad("attention", "apply_rotary_pos_emb-unsqueeze_dim-str", TypeError, ["unsqueeze_dim", "str"])(
    lambda p, d: p.apply_rotary_pos_emb(r(1, 2, 5, 16, device=d), r(1, 2, 5, 16, device=d), r(1, 5, 16, device=d),
                                        r(1, 5, 16, device=d), "1"))
bad("norms", "norm_modulate-eager_rounding-str", TypeError, ["eager_rounding", "bool"])(
    lambda p, d: p.norm_modulate(r(2, 3, N, device=d), r(2, N, device=d), r(2, N, device=d), eager_rounding="false"))

for _name in ("add_rms_norm", "add_layer_norm"):
    def _g(pkg, name=_name):
        return getattr(pkg, name)
    bad("norms", f"{_name}-residual-shape", ValueError, ["residual", "shape"])(
        lambda p, d, f=_g: f(p)(r(2, N, device=d), r(3, N, device=d)))
    bad("norms", f"{_name}-residual-int", TypeError, ["residual", "dtype"])(
        lambda p, d, f=_g: f(p)(r(2, N, device=d), torch.ones(2, N, dtype=INT, device=d)))
    bad("norms", f"{_name}-residual-none", TypeError, ["residual"])(
        lambda p, d, f=_g: f(p)(r(2, N, device=d), None))
    bad("norms", f"{_name}-residual-device", ValueError, ["residual", "device"])(
        lambda p, d, f=_g: f(p)(r(2, N, device=d), r(2, N, device=other_device(d))))
    bad("norms", f"{_name}-eps-negative", ValueError, ["eps"])(
        lambda p, d, f=_g: f(p)(r(2, N, device=d), r(2, N, device=d), None, None, -1.0))

bad("norms", "rms_norm-weight_offset-str", TypeError, ["weight_offset"])(
    lambda p, d: p.rms_norm(r(2, N, device=d), r(N, device=d), weight_offset="one"))
bad("norms", "rms_norm-weight_offset-nan", ValueError, ["weight_offset"])(
    lambda p, d: p.rms_norm(r(2, N, device=d), r(N, device=d), weight_offset=math.nan))
bad("norms", "rms_norm-cast_dtype-int", TypeError, ["cast_dtype"])(
    lambda p, d: p.rms_norm(r(2, N, device=d), cast_dtype=torch.int32))
bad("norms", "rms_norm-out_dtype-fp8", TypeError, ["out_dtype"])(
    lambda p, d: p.rms_norm(r(2, N, device=d), out_dtype=FP8))

bad("norms", "gated_residual-x-int", TypeError, ["x", "dtype"])(
    lambda p, d: p.gated_residual(torch.ones(2, 3, N, dtype=INT, device=d), r(2, 3, N, device=d), r(N, device=d)))
bad("norms", "gated_residual-x-2d", ValueError, ["x", "3-D"])(
    lambda p, d: p.gated_residual(r(3, N, device=d), r(3, N, device=d), r(N, device=d)))
bad("norms", "gated_residual-y-shape", ValueError, ["y", "shape"])(
    lambda p, d: p.gated_residual(r(2, 3, N, device=d), r(2, 4, N, device=d), r(N, device=d)))
bad("norms", "gated_residual-y-device", ValueError, ["y", "device"])(
    lambda p, d: p.gated_residual(r(2, 3, N, device=d), r(2, 3, N, device=other_device(d)), r(N, device=d)))
bad("norms", "gated_residual-gate-shape", ValueError, ["gate", "shape"])(
    lambda p, d: p.gated_residual(r(2, 3, N, device=d), r(2, 3, N, device=d), r(2, 3, N, device=d)))
bad("norms", "gated_residual-gate-fp64", TypeError, ["gate", "dtype"])(
    lambda p, d: p.gated_residual(r(2, 3, N, device=d), r(2, 3, N, device=d), r(N, device=d, dtype=torch.float64)))
bad("norms", "gated_residual-out_dtype-int", TypeError, ["out_dtype"])(
    lambda p, d: p.gated_residual(r(2, 3, N, device=d), r(2, 3, N, device=d), r(N, device=d), out_dtype=torch.int32))

# ----------------------------------------------------------------------------- activations
GATED = ["silu_and_mul", "mul_and_silu", "gelu_and_mul", "gelu_tanh_and_mul", "fatrelu_and_mul"]
PLAIN = ["silu", "gelu", "gelu_tanh", "gelu_new", "gelu_fast", "gelu_quick"]
for _name in GATED + PLAIN:
    w = 2 * 19 if _name in GATED else 19
    bad("activations", f"{_name}-x-int", TypeError, ["x", "dtype"])(
        lambda p, d, n=_name, w=w: getattr(p, n)(torch.ones(2, w, dtype=INT, device=d)))
    bad("activations", f"{_name}-x-fp8", TypeError, ["x", "dtype"])(
        lambda p, d, n=_name, w=w: getattr(p, n)(r(2, w, device=d).to(FP8)))
    bad("activations", f"{_name}-x-list", TypeError, ["x", "Tensor"])(
        lambda p, d, n=_name: getattr(p, n)([1.0, 2.0]))
    bad("activations", f"{_name}-out-shape", ValueError, ["out", "shape"])(
        lambda p, d, n=_name, w=w: getattr(p, n)(r(2, w + 2, device=d), r(2, w, device=d)))
    bad("activations", f"{_name}-out-dtype", TypeError, ["out", "dtype"])(
        lambda p, d, n=_name, w=w: getattr(p, n)(r(2, w // 2 if n in GATED else w, device=d, dtype=torch.float16),
                                                 r(2, w, device=d)))
    bad("activations", f"{_name}-out-device", ValueError, ["out", "device"])(
        lambda p, d, n=_name, w=w: getattr(p, n)(r(2, w // 2 if n in GATED else w, device=other_device(d)),
                                                 r(2, w, device=d)))
    bad("activations", f"{_name}-out-expanded", ValueError, ["out", "overlapping"])(
        lambda p, d, n=_name, w=w: getattr(p, n)(r(1, w // 2 if n in GATED else w, device=d).expand(2, -1),
                                                 r(2, w, device=d)))
    bad("activations", f"{_name}-rounding-unknown", ValueError, ["rounding"])(
        lambda p, d, n=_name, w=w: getattr(p, n)(r(2, w, device=d), rounding="exact"))
for _name in GATED:
    bad("activations", f"{_name}-odd-width", ValueError, ["last dim", "even"])(
        lambda p, d, n=_name: getattr(p, n)(r(2, 37, device=d)))
    bad("activations", f"{_name}-x-0d", ValueError, ["x", "0-d"])(lambda p, d, n=_name: getattr(p, n)(r(device=d)))
bad("activations", "fatrelu_and_mul-threshold-nan", ValueError, ["threshold"])(
    lambda p, d: p.fatrelu_and_mul(r(2, 8, device=d), threshold=math.nan))
bad("activations", "fatrelu_and_mul-threshold-tensor", TypeError, ["threshold"])(
    lambda p, d: p.fatrelu_and_mul(r(2, 8, device=d), threshold=torch.tensor(0.5)))
bad("activations", "fatrelu_and_mul-threshold-str", TypeError, ["threshold"])(
    lambda p, d: p.fatrelu_and_mul(r(2, 8, device=d), threshold="0.5"))

# ----------------------------------------------------------------------------- softmax
for _name in ("softmax", "log_softmax"):
    f = (lambda p, n=_name: getattr(p, n))
    bad("softmax", f"{_name}-x-int", TypeError, ["x", "dtype"])(
        lambda p, d, f=f: f(p)(torch.ones(2, 5, dtype=INT, device=d)))
    bad("softmax", f"{_name}-x-fp8", TypeError, ["x", "dtype"])(lambda p, d, f=f: f(p)(r(2, 5, device=d).to(FP8)))
    bad("softmax", f"{_name}-x-fp64", TypeError, ["x", "dtype"])(
        lambda p, d, f=f: f(p)(r(2, 5, device=d, dtype=torch.float64)))
    bad("softmax", f"{_name}-x-list", TypeError, ["x", "Tensor"])(lambda p, d, f=f: f(p)([1.0, 2.0]))
    bad("softmax", f"{_name}-x-none", TypeError, ["x", "Tensor"])(lambda p, d, f=f: f(p)(None))
    bad("softmax", f"{_name}-dim-range", IndexError, ["Dimension out of range"])(
        lambda p, d, f=f: f(p)(r(2, 5, device=d), 2))
    bad("softmax", f"{_name}-dim-float", TypeError, ["dim"])(lambda p, d, f=f: f(p)(r(2, 5, device=d), 1.0))
    bad("softmax", f"{_name}-scale-tensor", TypeError, ["scale"])(
        lambda p, d, f=f: f(p)(r(2, 5, device=d), scale=torch.tensor(0.5)))
    bad("softmax", f"{_name}-scale-nan", ValueError, ["scale"])(
        lambda p, d, f=f: f(p)(r(2, 5, device=d), scale=math.nan))
    bad("softmax", f"{_name}-mask-bool", TypeError, ["mask"])(
        lambda p, d, f=f: f(p)(r(2, 5, device=d), mask=torch.ones(2, 5, dtype=torch.bool, device=d)))
    bad("softmax", f"{_name}-mask-int", TypeError, ["mask", "dtype"])(
        lambda p, d, f=f: f(p)(r(2, 5, device=d), mask=torch.zeros(2, 5, dtype=INT, device=d)))
    bad("softmax", f"{_name}-mask-shape", ValueError, ["mask", "broadcast"])(
        lambda p, d, f=f: f(p)(r(2, 5, device=d), mask=r(3, 5, device=d)))
    bad("softmax", f"{_name}-mask-device", ValueError, ["mask", "device"])(
        lambda p, d, f=f: f(p)(r(2, 5, device=d), mask=r(2, 5, device=other_device(d))))
    bad("softmax", f"{_name}-mask-list", TypeError, ["mask"])(
        lambda p, d, f=f: f(p)(r(2, 5, device=d), mask=[[0.0] * 5] * 2))
    bad("softmax", f"{_name}-causal-int", TypeError, ["causal"])(
        lambda p, d, f=f: f(p)(r(2, 5, device=d), causal=1))
    bad("softmax", f"{_name}-causal-dim", ValueError, ["causal", "dim"])(
        lambda p, d, f=f: f(p)(r(2, 5, device=d), 0, causal=True))


def _ce(p, d, logits=None, target=None, **kw):
    logits = r(4, 7, device=d) if logits is None else logits
    target = torch.tensor([0, 1, 2, 6], device=d) if target is None else target
    return p.cross_entropy(logits, target, **kw)


bad("softmax", "cross_entropy-logits-int", TypeError, ["logits", "dtype"])(
    lambda p, d: _ce(p, d, logits=torch.ones(4, 7, dtype=INT, device=d)))
bad("softmax", "cross_entropy-logits-fp8", TypeError, ["logits", "dtype"])(
    lambda p, d: _ce(p, d, logits=r(4, 7, device=d).to(FP8)))
bad("softmax", "cross_entropy-logits-0d", ValueError, ["logits"])(lambda p, d: _ce(p, d, logits=r(device=d)))
bad("softmax", "cross_entropy-logits-list", TypeError, ["logits", "Tensor"])(
    lambda p, d: _ce(p, d, logits=[[0.0] * 7] * 4))
bad("softmax", "cross_entropy-target-float", TypeError, ["target"])(
    lambda p, d: _ce(p, d, target=r(4, device=d)))
bad("softmax", "cross_entropy-target-list", TypeError, ["target", "Tensor"])(lambda p, d: _ce(p, d, target=[0, 1, 2, 3]))
bad("softmax", "cross_entropy-target-shape", ValueError, ["target", "shape"])(
    lambda p, d: _ce(p, d, target=torch.zeros(5, dtype=torch.long, device=d)))
bad("softmax", "cross_entropy-target-device", ValueError, ["target", "device"])(
    lambda p, d: _ce(p, d, target=torch.zeros(4, dtype=torch.long, device=other_device(d))))
bad("softmax", "cross_entropy-ignore_index-float", TypeError, ["ignore_index"])(
    lambda p, d: _ce(p, d, ignore_index=-100.0))
bad("softmax", "cross_entropy-reduction-unknown", ValueError, ["reduction"])(lambda p, d: _ce(p, d, reduction="avg"))
bad("softmax", "cross_entropy-label_smoothing-range", ValueError, ["label_smoothing"])(
    lambda p, d: _ce(p, d, label_smoothing=1.5))
bad("softmax", "cross_entropy-label_smoothing-negative", ValueError, ["label_smoothing"])(
    lambda p, d: _ce(p, d, label_smoothing=-0.1))
bad("softmax", "cross_entropy-z_loss-negative", ValueError, ["z_loss"])(lambda p, d: _ce(p, d, z_loss=-1e-4))
bad("softmax", "cross_entropy-z_loss-nan", ValueError, ["z_loss"])(lambda p, d: _ce(p, d, z_loss=math.nan))

# ----------------------------------------------------------------------------- matmul
H = torch.float16
bad("matmul", "matmul-a-int", TypeError, ["a", "dtype"])(
    lambda p, d: p.matmul(torch.ones(3, 8, dtype=INT, device=d), r(8, 4, device=d, dtype=H)))
bad("matmul", "matmul-b-fp8", TypeError, ["b", "dtype"])(
    lambda p, d: p.matmul(r(3, 8, device=d, dtype=H), r(8, 4, device=d).to(FP8)))
bad("matmul", "matmul-a-list", TypeError, ["a", "Tensor"])(lambda p, d: p.matmul([[1.0] * 8], r(8, 4, device=d, dtype=H)))
bad("matmul", "matmul-dtype-mismatch", TypeError, ["a and b", "dtype"])(
    lambda p, d: p.matmul(r(3, 8, device=d, dtype=H), r(8, 4, device=d, dtype=torch.bfloat16)))
bad("matmul", "matmul-K-mismatch", ValueError, ["a of shape", "b of shape"])(
    lambda p, d: p.matmul(r(3, 8, device=d, dtype=H), r(9, 4, device=d, dtype=H)))
bad("matmul", "matmul-b-3d", ValueError, ["b", "2"])(
    lambda p, d: p.matmul(r(3, 8, device=d, dtype=H), r(1, 8, 4, device=d, dtype=H)))
bad("matmul", "matmul-b-device", ValueError, ["b", "device"])(
    lambda p, d: p.matmul(r(3, 8, device=d, dtype=H), r(8, 4, device=other_device(d), dtype=H)))
bad("matmul", "matmul-bias-shape", ValueError, ["bias", "shape"])(
    lambda p, d: p.matmul(r(3, 8, device=d, dtype=H), r(8, 4, device=d, dtype=H), r(5, device=d, dtype=H)))
bad("matmul", "matmul-bias-dtype", TypeError, ["bias", "dtype"])(
    lambda p, d: p.matmul(r(3, 8, device=d, dtype=H), r(8, 4, device=d, dtype=H), r(4, device=d)))
bad("matmul", "matmul-bias-device", ValueError, ["bias", "device"])(
    lambda p, d: p.matmul(r(3, 8, device=d, dtype=H), r(8, 4, device=d, dtype=H), r(4, device=other_device(d), dtype=H)))
bad("matmul", "matmul-bias-list", TypeError, ["bias"])(
    lambda p, d: p.matmul(r(3, 8, device=d, dtype=H), r(8, 4, device=d, dtype=H), [0.0] * 4))
bad("matmul", "matmul-activation-unknown", ValueError, ["activation"])(
    lambda p, d: p.matmul(r(3, 8, device=d, dtype=H), r(8, 4, device=d, dtype=H), None, "tanh"))
bad("matmul", "matmul-gated-odd-N", ValueError, ["activation", "even"])(
    lambda p, d: p.matmul(r(3, 8, device=d, dtype=H), r(8, 5, device=d, dtype=H), None, "swiglu"))
bad("matmul", "matmul-config-type", TypeError, ["config"])(
    lambda p, d: p.matmul(r(3, 8, device=d, dtype=H), r(8, 4, device=d, dtype=H), config={"BLOCK_M": 16}))


@pytest.mark.parametrize("fixture, call, exc, words", CATALOG)
def test_bad_input_raises_clear_error_naming_the_argument(request, device, fixture, call, exc, words):
    pkg = request.getfixturevalue(fixture)
    with pytest.raises(exc) as info:
        call(pkg, device)
    message = str(info.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"message {message!r} lacks {missing}"


# ----------------------------------------------------------------------------- layers


@pytest.mark.parametrize("fixture, picker, args, words", [
    ("norms", "pick_config", ([4096], 2), "N must be an int"),
    ("softmax", "pick_config", (4096, [2]), "element_size must be an int"),
    ("activations", "pick_config", (4096, 2, 32, 1, [4096]), "tile_bytes must be an int"),
    ("attention", "pick_fwd_config", ([128], False), "head_dim must be an int"),
    ("attention", "pick_bwd_config", (128, False, [32]), "warp_size must be an int"),
    ("matmul", "pick_config", (5, [7], 9), "N must be an int"),
    ("matmul", "pick_config", (5, 7, 9, ["NVIDIA H200"]), "gpu_name must be None or a string"),
    ("norms", "pick_config", (torch.tensor(4096), 2), "N must be an int"),
])
def test_config_pickers_name_an_unhashable_argument(request, fixture, picker, args, words):
    """The public config pickers are cached: an unhashable argument (a list, a tensor) gave lru_cache's "unhashable
    type" TypeError, naming no argument. Their own checks now name it, and a valid call still hits the cache."""
    pick = getattr(request.getfixturevalue(fixture), picker)
    with pytest.raises(ValueError, match=words):
        pick(*args)
    pick.cache_clear()
    valid = tuple(a[0] if isinstance(a, list) else int(a) if isinstance(a, torch.Tensor) else a for a in args)
    first = pick(*(valid if "gpu_name" not in words else valid[:3]))
    assert pick(*(valid if "gpu_name" not in words else valid[:3])) is first and pick.cache_info().hits == 1


def test_bad_input_layers(norms, activations, softmax, device):
    """Layers raise clear errors for what their modules hold: a class weight, no threshold."""
    from torch import nn

    holder = nn.Module()  # what the module holds, without nn.CrossEntropyLoss's forward to fall back on
    holder.weight, holder.ignore_index = torch.ones(7, device=device), -100
    holder.reduction, holder.label_smoothing = "mean", 0.0
    with pytest.raises(ValueError, match="weight"):
        softmax.layers.CrossEntropyLoss.forward(holder, r(4, 7, device=device),
                                               torch.zeros(4, dtype=torch.long, device=device))
    with pytest.raises(AttributeError, match="threshold"):
        activations.layers.FatreluAndMul.forward(nn.Module(), r(2, 8, device=device))
    with pytest.raises(ValueError, match="normalized_shape"):  # an input that does not end with the module's shape
        norms.layers.LayerNorm.forward(nn.LayerNorm(5).to(device), r(2, 6, device=device))


@pytest.mark.parametrize("make, layer", [(lambda: torch.nn.LayerNorm(()), "LayerNorm"),
                                         (lambda: torch.nn.RMSNorm(()), "TorchRMSNorm")])
def test_norm_layers_refuse_an_empty_normalized_shape_as_their_modules(norms, device, make, layer):
    """``nn.LayerNorm(())`` / ``nn.RMSNorm(())`` raise on every call (no dim to normalise over); their layers gave a
    result instead (every element its own row of one: zeros for LayerNorm, signs for RMSNorm)."""
    module, x = make().to(device), r(2, 3, device=device)
    with pytest.raises(RuntimeError, match="normalized_shape"):
        module(x)
    with pytest.raises(ValueError, match="normalized_shape") as err:
        getattr(norms.layers, layer).forward(module, x)
    assert isinstance(err.value, RuntimeError)  # the module's type too: code catching RuntimeError keeps working


@pytest.mark.parametrize("case", ["layer_norm_shape", "rms_norm_shape", "linear_dtype", "linear_features"])
def test_layers_refuse_what_their_modules_refuse_with_a_runtime_error(norms, matmul, device, case):
    """An input the module refuses with a RuntimeError: the layer's error (a ValueError or TypeError naming the
    argument) is a RuntimeError too, so a caller's ``except RuntimeError`` catches both (it caught only the
    module's)."""
    from torch import nn

    module, layer, x = {
        "layer_norm_shape": (nn.LayerNorm(64), norms.layers.LayerNorm, r(3, 32, device=device)),
        "rms_norm_shape": (nn.RMSNorm(64), norms.layers.TorchRMSNorm, r(3, 32, device=device)),
        "linear_dtype": (nn.Linear(64, 8), matmul.layers.Linear, r(3, 64, device=device).half()),
        "linear_features": (nn.Linear(64, 8), matmul.layers.Linear, r(3, 32, device=device)),
    }[case]
    module = module.to(device)
    with pytest.raises(RuntimeError):
        module(x)
    with pytest.raises(RuntimeError) as err:
        layer.forward(module, x)
    assert isinstance(err.value, (TypeError, ValueError)), type(err.value)
    assert ("normalized_shape" if "norm" in case else "input") in str(err.value)


# ----------------------------------------------------------------------------- empty tensors: PyTorch's result


def _same_as_torch(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    torch.testing.assert_close(got.cpu(), want.cpu(), equal_nan=True, rtol=1e-5, atol=1e-6)


EMPTY_SHAPES = [(0, 5), (2, 0, 5), (0, 0), (3, 0)]


@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=str)
def test_empty_tensors_norms_equal_pytorch(norms, device, shape):
    x = r(*shape, device=device)
    n = shape[-1]
    w, b = r(n, device=device), r(n, device=device)
    _same_as_torch(norms.rms_norm(x, w, None, 1e-6), F.rms_norm(x, (n,), w, 1e-6))
    _same_as_torch(norms.layer_norm(x, w, b, 1e-5), F.layer_norm(x, (n,), w, b, 1e-5))
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    y = norms.layer_norm(xg, wg, bg, 1e-5)
    y.sum().backward()
    xe, we, be = (t.clone().requires_grad_() for t in (x, w, b))
    F.layer_norm(xe, (n,), we, be, 1e-5).sum().backward()
    for a, e in ((xg, xe), (wg, we), (bg, be)):
        _same_as_torch(a.grad, e.grad)


@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=str)
def test_empty_tensors_activations_softmax_equal_pytorch(activations, softmax, device, shape):
    x = r(*shape, device=device)
    _same_as_torch(activations.silu(x), F.silu(x))
    _same_as_torch(activations.gelu_tanh(x), F.gelu(x, approximate="tanh"))
    if shape[-1] % 2 == 0:
        xs = x.clone().requires_grad_()
        y = activations.silu_and_mul(xs)
        d = shape[-1] // 2
        _same_as_torch(y, F.silu(x[..., :d]) * x[..., d:])
        y.sum().backward()
        assert xs.grad.shape == x.shape
    for dim in range(-len(shape), len(shape)):
        _same_as_torch(softmax.softmax(x, dim), torch.softmax(x, dim))
        _same_as_torch(softmax.log_softmax(x, dim), torch.log_softmax(x, dim))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_empty_tensors_cross_entropy_equal_pytorch(softmax, device, reduction):
    logits = r(0, 7, device=device)
    target = torch.zeros(0, dtype=torch.long, device=device)
    _same_as_torch(softmax.cross_entropy(logits, target, reduction=reduction),
                   F.cross_entropy(logits, target, reduction=reduction))


@pytest.mark.parametrize("m, k, n", [(0, 8, 4), (3, 0, 4), (3, 8, 0), (0, 0, 0)])
def test_empty_tensors_matmul_equal_pytorch(matmul, device, m, k, n):
    a, b, bias = r(m, k, device=device, dtype=H), r(k, n, device=device, dtype=H), r(n, device=device, dtype=H)
    _same_as_torch(matmul.matmul(a, b, bias), (a.float() @ b.float() + bias.float()).to(H))


# ----------------------------------------------------------------------------- NaN / inf: PyTorch's positions


def _specials(shape, device, dtype=torch.float32):
    x = torch.randn(shape)
    flat = x.view(-1)
    flat[1], flat[shape[-1] + 2], flat[2 * shape[-1] + 3] = math.nan, math.inf, -math.inf
    return x.to(dtype).to(device)


def _same_specials(name, got, want):
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    assert got.shape == want.shape, name
    assert torch.equal(got.isnan(), want.isnan()), f"{name}: NaN positions differ from PyTorch's"
    assert torch.equal(got.isposinf(), want.isposinf()) and torch.equal(got.isneginf(), want.isneginf()), \
        f"{name}: infinities differ from PyTorch's"
    fin = want.isfinite()
    torch.testing.assert_close(got[fin], want[fin], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nan_inf_propagate_as_pytorch(norms, activations, softmax, matmul, device, dtype):
    """Rows 0-2 hold a NaN, a +inf and a -inf, row 3 is clean; every op against PyTorch's own op."""
    x = _specials((4, 22), device, dtype)
    n = x.shape[-1]
    w, b = r(n, device=device, dtype=dtype), r(n, device=device, dtype=dtype)
    xf = x.float()
    # rms_norm's default (and "mean") order follows the eager formula (transformers' RMSNorms): a row holding
    # +-inf is NaN at the inf and +-0 elsewhere. F.rms_norm differs by device: its CPU kernel is that formula,
    # its CUDA kernel (Welford partials) makes the whole row NaN; torch_order="fused" reproduces the CUDA one
    # (checked against it on the GPU) and F.layer_norm's, which is NaN throughout on every device.
    formula = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    _same_specials("rms_norm", norms.rms_norm(x, w, None, 1e-6), formula)
    _same_specials("rms_norm mean order", norms.rms_norm(x, w, None, 1e-6, torch_order="mean"), formula)
    _same_specials("layer_norm", norms.layer_norm(x, w, b, 1e-5), F.layer_norm(xf, (n,), w.float(), b.float()))
    y_add, _ = norms.add_rms_norm(x, torch.zeros_like(x), w, None, 1e-6)
    _same_specials("add_rms_norm", y_add, formula)
    if device == "cuda":
        _same_specials("rms_norm fused order", norms.rms_norm(x, w, None, 1e-6, torch_order="fused"),
                       F.rms_norm(xf, (n,), w.float(), 1e-6))
        _same_specials("layer_norm fused order", norms.layer_norm(x, w, b, 1e-5, torch_order="fused"),
                       F.layer_norm(xf, (n,), w.float(), b.float()))
    d = n // 2
    # gelu: torch's CPU fp32/bf16 kernel returns NaN for +inf where its fp64 (and the math) give +inf: fp64 here
    for name, want in (("silu", F.silu(xf)), ("gelu", F.gelu(xf.double())), ("gelu_tanh", F.gelu(xf, approximate="tanh")),
                       ("gelu_quick", xf * torch.sigmoid(1.702 * xf)),
                       ("silu_and_mul", F.silu(xf[:, :d]) * xf[:, d:]),
                       ("gelu_and_mul", F.gelu(xf[:, :d].double()) * xf[:, d:]),
                       ("mul_and_silu", xf[:, :d] * F.silu(xf[:, d:]))):
        _same_specials(name, getattr(activations, name)(x), want)
    for dim in (0, 1):
        _same_specials(f"softmax dim={dim}", softmax.softmax(x, dim), torch.softmax(xf, dim))
        _same_specials(f"log_softmax dim={dim}", softmax.log_softmax(x, dim), torch.log_softmax(xf, dim))
    t = torch.tensor([0, 5, 7, 3], device=device)
    for red in ("none", "sum"):
        _same_specials(f"cross_entropy {red}", softmax.cross_entropy(x, t, reduction=red),
                       F.cross_entropy(xf, t, reduction=red))
    if dtype != torch.float32:
        wt = r(n, 6, device=device, dtype=dtype)
        _same_specials("matmul", matmul.matmul(x, wt, None, "gelu"), F.gelu((xf @ wt.float()).double()))


_ROUND_KERNEL = """
import sys
import triton
import triton.language as tl
R = sys.modules[{name!r}]


@triton.jit
def rnd(x_ptr, y_ptr, n, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    live = offs < n
    tl.store(y_ptr + offs, R.round_to(tl.load(x_ptr + offs, mask=live), DTYPE), mask=live)
"""


def test_round_to_bf16_keeps_every_nan_and_rounds_as_torch(norms, device, tmp_path):
    """``_rounding.round_to`` (the kernels' rounding to the storage dtype) against torch's ``.to(bfloat16)`` over fp32
    bit patterns: ties to even, overflow to inf, and NaN stays NaN whatever its payload (under the interpreter the
    rounding is integer arithmetic on the bits, where a NaN's payload could carry into the exponent or the sign:
    0x7F800001 would become inf, 0x7FFFFFFF -0.0, 0xFFFFFFFF +0.0)."""
    import importlib.util

    path = tmp_path / "round_kernel.py"
    path.write_text(_ROUND_KERNEL.format(name=norms.__name__ + "._rounding"))
    spec = importlib.util.spec_from_file_location("round_kernel_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rounding = sys.modules[norms.__name__ + "._rounding"]
    nans = [0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0x7FFF8000, 0x7FFFFFFF, 0xFF800001, 0xFFC00000, 0xFFFFFFFF]
    ties = [0x3F808000, 0x3F818000, 0xBF808000, 0x00008000, 0x7F7F8000, 0x7F7FFFFF]  # even/odd ties, max -> inf
    seed = int(torch.randint(0, 2**31, (1,)))
    rng = torch.Generator().manual_seed(seed)
    bits = nans + ties + [0, 0x80000000, 0x7F800000, 0xFF800000, 1] + torch.randint(0, 2**32, (237,),
                                                                                       generator=rng).tolist()
    x = torch.tensor([b - 2**32 if b >= 2**31 else b for b in bits], dtype=torch.int32).view(torch.float32)
    y = torch.full_like(x, 123.0).to(device)
    mod.rnd[(1,)](x.to(device), y, x.numel(), DTYPE=rounding.round_dtype(torch.bfloat16), BLOCK=256)
    y, want = y.cpu(), x.to(torch.bfloat16).float()
    assert torch.equal(y.isnan(), x.isnan()), [hex(b) for b, a in zip(bits, y.isnan()) if not a and b in nans]
    keep = ~x.isnan()
    assert torch.equal(y[keep].view(torch.int32), want[keep].view(torch.int32)), seed
    assert rounding.round_dtype(torch.float32) is None and rounding.round_dtype(None) is None
