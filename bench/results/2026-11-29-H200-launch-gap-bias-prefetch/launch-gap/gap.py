"""Where the event-timed call of kforge's GEMM spends the time its kernel does not: each
GEMM (kforge's library variant and PyTorch's) timed by events as bench/peers does, and its
activities listed for a few calls relative to the opening spin's end."""
import json, subprocess, sys, statistics
sys.path.insert(0, "bench")
import torch
from kforge_call import Timer, bind_entry
from torch.profiler import ProfilerActivity, profile

props = torch.cuda.get_device_properties(0)
timer = Timer(torch, props.L2_cache_size, max_seconds=2.0)
stream = torch.cuda.current_stream().cuda_stream

def dump(fn, label, calls=4):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            timer._before_call(); fn(); torch.cuda._sleep(1000)
        torch.cuda.synchronize()
    acts = sorted((e for e in prof.profiler.kineto_results.events()
                   if str(e.device_type()).endswith("CUDA")), key=lambda e: e.start_ns())
    spin_end = None
    for e in acts:
        n = e.name()
        if "spin_kernel" in n:
            if e.duration_ns() > 3000: spin_end = e.end_ns(); print(f"  {label}: --- spin")
            continue
        if spin_end is None: continue
        print(f"  {label}: {n[:90]:90s} start {(e.start_ns()-spin_end)/1e3:8.2f} dur {e.duration_ns()/1e3:8.2f}")

jobs = [j.split(":") for j in sys.argv[1:]] or [("matmul", "4096x4096x4096")]
procs = {tuple(j): subprocess.Popen(["build/ci/kforge", "build", j[0], "--dtype", "bf16", "--shape",
                                     j[1], "--json", "-"], stdout=subprocess.PIPE, text=True)
         for j in jobs}
for op, shape in jobs:
    out, _ = procs[(op, shape)].communicate()
    m = json.loads(out)["modules"][0]
    M, N, K = map(int, shape.split("x"))
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ins = [a, b]
    if op == "matmul_bias":
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16); ins.append(bias)
        eager = lambda: torch.addmm(bias, a, b)
    else:
        eager = lambda: torch.matmul(a, b)
    kf = bind_entry(m["module"], m["entry"], ins, [c], ["bf16"] * (len(ins) + 1), stream)
    timer.cold_tensors = ins + [c]
    kf2 = lambda: (kf(), kf())
    eager2 = lambda: (eager(), eager())
    print(f"== {op} {shape}: {m.get('variant', m.get('params', ''))}")
    for rep in range(2):
        r = {}
        for name, fn in [("kforge", kf), ("eager", eager), ("kforge x2", kf2), ("eager x2", eager2)]:
            r[name] = timer.time_us(fn)["median_us"]
        kt = {name: timer.kernel_us(fn) for name, fn in [("kforge", kf), ("eager", eager)]}
        print(f"  rep {rep}: events " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))
        for name, t in kt.items():
            print(f"    {name}: sum {t['sum_median_us']:.2f} span {t['span_median_us']:.2f} lead {t['lead_us']:.2f} trail {t['trail_us']:.2f} n {t['activities_per_call']} {t['kernels']}")
    dump(kf, "kforge"); dump(eager, "eager")
