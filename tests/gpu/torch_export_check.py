"""Checks a `kforge export --target torch` package on a GPU (run by test_export_gpu.cpp).

    python3 tests/gpu/torch_export_check.py EXPORT_DIR

For every exported op at its first covered size: the op against its ATen composite (within
the export's manifest tolerance), counted as a kforge call; the same op at an uncovered size,
non-contiguous and on the CPU falls back, counted with its reason; torch.compile(fullgraph=True)
traces through it (fake implementations); a backward through it is an error naming the op; under
a CUDA graph it replays. Then the host overhead of a covered call over the module alone.
Prints one line per check and exits non-zero on any failure.
"""
import gc
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.abspath(sys.argv[1]))
import kforge_ops  # noqa: E402

failures = []


def check(what, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'}  {what}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        failures.append(what)


DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def inputs_for(op, sizes, dtype):
    return kforge_ops.example_inputs(op, sizes, dtype)


def call(op, args):
    return getattr(torch.ops.kforge, op)(*args)


def composite(op, args):
    """The extension's own fallback: the op on CPU tensors, moved back."""
    cpu = [a.cpu() if torch.is_tensor(a) else a for a in args]
    return call(op, cpu).cuda()


for entry in kforge_ops.manifest["ops"]:
    op, dtype = entry["op"], DTYPES[entry["dtype"]]
    sizes = entry["rows"][0]["sizes"]
    args = inputs_for(op, sizes, dtype)
    kforge_ops.reset_stats()
    with torch.inference_mode():
        got = call(op, args)
        want = composite(op, args)
    stats = kforge_ops.stats().get(op, {})
    check(f"{op} {entry['dtype']} {entry['rows'][0]['shape']} runs kforge", stats.get("kforge") == 1, str(stats))
    err = ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)).item()
    check(f"{op} {entry['dtype']} matches its composite", err < (2e-2 if dtype != torch.float32 else 1e-4), f"{err:.2e}")

    # Uncovered: a size one larger in the last dim of the first input falls back, counted.
    if op not in ("cross_entropy",):
        kforge_ops.reset_stats()
        bigger = list(args)
        x = bigger[0]
        if op in ("rmsnorm", "layernorm"):
            n = x.shape[-1] + 8
            bigger[0] = torch.randn(x.shape[0], n, device="cuda").to(dtype)
            bigger[1] = torch.randn(n, device="cuda").to(dtype)
            if op == "layernorm":
                bigger[2] = torch.randn(n, device="cuda").to(dtype)
        else:
            bigger[0] = torch.cat([x, x[:1]], 0)
        with torch.inference_mode():
            call(op, bigger)
        reasons = kforge_ops.stats().get(op, {})
        check(f"{op}: an uncovered size falls back, counted", "kforge" not in reasons and sum(reasons.values()) == 1, str(reasons))

    # Non-contiguous and CPU tensors fall back.
    kforge_ops.reset_stats()
    with torch.inference_mode():
        call(op, [a.cpu() if torch.is_tensor(a) else a for a in args])
    check(f"{op}: CPU tensors fall back", "device" in " ".join(kforge_ops.stats().get(op, {})), str(kforge_ops.stats().get(op)))

    # torch.compile keeps one graph around the op.
    torch._dynamo.reset()
    try:
        compiled = torch.compile(lambda *a: call(op, a), fullgraph=True)
        with torch.inference_mode():
            out = compiled(*args)
        check(f"{op}: torch.compile(fullgraph=True) traces it", out.shape == got.shape)
    except Exception as e:  # noqa: BLE001
        check(f"{op}: torch.compile(fullgraph=True) traces it", False, repr(e)[:200])

    # No backward: an error naming the op.
    grad_args = [a.detach().clone().requires_grad_(True) if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
    try:
        call(op, grad_args).float().sum().backward()
        check(f"{op}: backward is an error", False, "no error")
    except RuntimeError as e:
        check(f"{op}: backward is an error", f"kforge::{op}" in str(e), str(e)[:120])

    # A CUDA graph replays it.
    static = [a.clone() if torch.is_tensor(a) else a for a in args]
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call(op, static)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = call(op, static)
        graph.replay()
        torch.cuda.synchronize()
        check(f"{op}: replays in a CUDA graph", torch.equal(captured, call(op, static)))

# Dispatch overhead, on the smallest exported size: the module's kforge_run alone against the op
# through the extension, both timed in C++ (their difference is what the dispatch adds: the
# table lookup, the ABI arguments and the output's allocation); then the op called from Python
# beside one ATen kernel called from Python (torch.neg, which also allocates its output), for
# the cost a Python caller sees. Every figure is host time per call, taken while a sleep kernel
# holds the GPU, so that the GPU's pace never sets the host's. Printed, not checked: the goal
# (under 2 us) is a benchmark's.
_, small, row = min(((math.prod(r["sizes"].values()), i, r) for i, e in enumerate(kforge_ops.manifest["ops"])
                    for r in e["rows"]), key=lambda c: (c[0], c[1]))
small = kforge_ops.manifest["ops"][small]
op, dtype = small["op"], DTYPES[small["dtype"]]
args = inputs_for(op, row["sizes"], dtype)
tensors = [a for a in args if torch.is_tensor(a)]
scalars = [float(a) for a in args if not torch.is_tensor(a)]


def python_us_per_call(fn, calls=256, rounds=9):
    """Median host microseconds per call of fn over `rounds` rounds of `calls` calls issued while
    the GPU sleeps (a round that found the GPU idle is timed again with a longer sleep)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    cycles, times = 20_000_000, []
    gc.disable()
    try:
        while len(times) < rounds:
            torch.cuda._sleep(cycles)
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            stop = time.perf_counter()
            held = not torch.cuda.current_stream().query()
            torch.cuda.synchronize()
            if held:
                times.append((stop - start) / calls * 1e6)
            else:
                cycles *= 2
    finally:
        gc.enable()
    return statistics.median(times)


with torch.inference_mode():
    module_us, op_us, lookup_us, alloc_us = kforge_ops._C.host_us_per_call(op, tensors, scalars, 9)
    kforge_ops.reset_stats()
    python_us = python_us_per_call(lambda: call(op, args))
    ran_kforge = "kforge" in kforge_ops.stats().get(op, {})
    neg_us = python_us_per_call(lambda: torch.neg(args[0]))
    direct = getattr(kforge_ops._C, op)
    direct_us = python_us_per_call(lambda: direct(*args))
print(f"dispatch overhead, {op} {row['shape']}: module alone {module_us:.2f} us, op through the "
      f"extension {op_us:.2f} us: {op_us - module_us:+.2f} us per call (goal: under 2 us); of it, "
      f"the table lookup {lookup_us:.2f} us, the output's allocation {alloc_us:.2f} us")
print(f"from Python: torch.ops.kforge.{op} {python_us:.2f} us per call, kforge_ops._C.{op} (what "
      f"patched models call outside compiled graphs) {direct_us:.2f} us, torch.neg {neg_us:.2f} us")
check(f"{op} {row['shape']}: the Python calls ran kforge", ran_kforge, str(kforge_ops.stats().get(op)))
print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
