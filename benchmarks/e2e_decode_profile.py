"""Where a greedy decode step goes, eager against kernelize (torch.profiler), and whether the tokens repeat.

    python3 benchmarks/e2e_decode_profile.py prof|det [MODEL] [BATCH]     # default llama3-8b 64; src/ on PYTHONPATH
    DEV=cpu TRITON_INTERPRET=1 python3 benchmarks/e2e_decode_profile.py prof tiny-llama 2    # a smoke run

``prof``: three 16-token generations per variant (repeatable? same tokens as eager?), ms per decode step twice, then a
profile of a 9-token generation per variant (self GPU time by kernel). ``det``: the same token checks under
``torch.use_deterministic_algorithms(True)`` (set ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` too): in the e2e, eager's own
tokens have not repeated at batch 64, which voids its token comparison there.
"""
import copy, os, sys, time
import torch
DEV = os.environ.get("DEV", "cuda")
sys.path.insert(0, "src")
from triton_collection.bench import load_packages
load_packages(["triton-norms", "triton-activations", "triton-attention"])
from kernels import Mode
from triton_collection.e2e import build_model
from triton_collection.integrations.families import ALL_FAMILIES
from triton_collection.integrations.transformers import kernelize

det = len(sys.argv) > 1 and sys.argv[1] == "det"
if det:
    torch.use_deterministic_algorithms(True)
name = sys.argv[2] if len(sys.argv) > 2 else "llama3-8b"
B = int(sys.argv[3]) if len(sys.argv) > 3 else 64
print(DEV, torch.__version__, "deterministic" if det else "default", name, "batch", B, flush=True)
model = build_model(name, device=DEV, dtype=torch.bfloat16)
k = copy.deepcopy(model)
kernelize(k, mode=Mode.INFERENCE, device=DEV, families=ALL_FAMILIES)  # the rotary: the LlamaAttention layers
g = torch.Generator(device="cpu").manual_seed(1)
ids = torch.randint(3, model.config.vocab_size, (B, 128), generator=g).to(DEV)
gen = dict(attention_mask=torch.ones_like(ids), do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=0)

def generate(m, n):
    return m.generate(ids, max_new_tokens=n, min_new_tokens=n, **gen)

with torch.no_grad():
    outs = {}
    for v, m in (("eager", model), ("kernelize", k)):
        generate(m, 4)
        outs[v] = [generate(m, 16)[:, 128:] for _ in range(3)]
        (torch.cuda.synchronize() if DEV == "cuda" else None)
        rep = all(torch.equal(o, outs[v][0]) for o in outs[v][1:])
        print(f"{v}: repeatable {rep}", flush=True)
    same = [torch.equal(a, b) for a, b in zip(outs["eager"], outs["kernelize"])]
    diff = (outs["eager"][0] != outs["kernelize"][0]).sum().item()
    print(f"kernelize vs eager same tokens per run: {same}; differing tokens in run 0: {diff} of {outs['eager'][0].numel()}", flush=True)
    if det:
        sys.exit(0)
    from torch.profiler import profile, ProfilerActivity
    for v, m in (("eager", model), ("kernelize", k)):
        for _ in range(2):
            (torch.cuda.synchronize() if DEV == "cuda" else None); t = time.perf_counter(); generate(m, 1); (torch.cuda.synchronize() if DEV == "cuda" else None); t1 = time.perf_counter() - t
            t = time.perf_counter(); generate(m, 17); (torch.cuda.synchronize() if DEV == "cuda" else None); t17 = time.perf_counter() - t
            print(f"{v}: {1e3 * (t17 - t1) / 16:.2f} ms/step", flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            generate(m, 9)
            (torch.cuda.synchronize() if DEV == "cuda" else None)
        ka = prof.key_averages()
        gpu_total = sum(e.self_device_time_total for e in ka) / 1e3
        print(f"--- {v}: total self GPU time {gpu_total:.1f} ms over prefill + 8 steps")
        print(ka.table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=60))
