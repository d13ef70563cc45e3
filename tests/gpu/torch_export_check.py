"""Checks a `kforge export --target torch` package on a GPU (run by test_export_gpu.cpp).

    python3 tests/gpu/torch_export_check.py EXPORT_DIR

For every exported op at its first covered size: the op against its ATen composite (within
the export's manifest tolerance), counted as a kforge call; the same op at an uncovered size,
non-contiguous and on the CPU falls back, counted with its reason; torch.compile(fullgraph=True)
traces through it (fake implementations); a backward through it is an error naming the op; under
a CUDA graph it replays. Then the host overhead of a covered call over the module alone.
Prints one line per check and exits non-zero on any failure.
"""
import os
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
    """The op's inputs (as in `kforge ops`) at `sizes`, on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    if op in ("rmsnorm", "reduce", "softmax"):
        m, n = (sizes.get("M") or sizes.get("rows")), (sizes.get("N") or sizes.get("cols"))
        x = randn(m, n)
        return (x, randn(n), 1e-6) if op == "rmsnorm" else (x,)
    if op == "layernorm":
        b, d = sizes["batch"], sizes["dim"]
        return randn(b, d), randn(d), randn(d), 1e-5
    if op == "cross_entropy":
        b, v = sizes["batch"], sizes["vocab"]
        return randn(b, v), torch.randint(0, v, (b,), device="cuda", generator=g)
    if op in ("rotary_embedding", "rotary_embedding_half"):
        b, h, s, d = sizes["batch"], sizes["heads"], sizes["seq_len"], sizes["head_dim"]
        angles = torch.rand(s, d // 2, device="cuda", generator=g) * 6.3
        return randn(b, h, s, d), angles.cos().to(dtype), angles.sin().to(dtype)
    raise ValueError(op)


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

# Host overhead: covered calls back to back on a small size, against the same launches from a
# CUDA graph (which has no host cost per call); the difference per call is the dispatch cost.
small = kforge_ops.manifest["ops"][0]
op, dtype = small["op"], DTYPES[small["dtype"]]
args = inputs_for(op, small["rows"][0]["sizes"], dtype)
with torch.inference_mode():
    for _ in range(10):
        call(op, args)
    torch.cuda.synchronize()
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        call(op, args)
    host_us = (time.perf_counter() - start) / n * 1e6
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(n):
        call(op, args)
    end.record()
    torch.cuda.synchronize()
    device_us = begin.elapsed_time(end) / n * 1e3
print(f"overhead {op} {small['rows'][0]['shape']}: host {host_us:.2f} us per call issued, "
      f"{device_us:.2f} us per call on the stream")
print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
