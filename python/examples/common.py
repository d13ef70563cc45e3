"""What the example models share: flags, inputs, the timed loop and the profiling switches.

A model script builds its module and its inputs and hands them to run(). The loop runs
--warmup iterations and then --iters timed ones, each inside an NVTX range "step", so that
`kforge profile --range step --skip W -- python3 llama.py ...` selects the timed iterations.
The last line printed is gpu_time_ms=<ms>: GPU time of the timed iterations, from CUDA events
recorded before the first and after the last timed step.
"""

import argparse
import contextlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kforge_ranges  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", choices=["cuda", "cpu"],
                   default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where to run (default: cuda when available)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                   help="parameter and activation dtype (default: bf16)")
    p.add_argument("--batch", type=int, default=None, help="batch size")
    p.add_argument("--seq", type=int, default=None, help="sequence length")
    p.add_argument("--iters", type=int, default=10, help="timed iterations (default: 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first (default: 3)")
    p.add_argument("--train", action="store_true",
                   help="forward + backward + optimizer step (default: inference forward with loss)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and inputs (default: 0)")
    trace = p.add_mutually_exclusive_group()
    trace.add_argument("--nvtx", action="store_true",
                       help="NVTX ranges for every ATen op with input shapes "
                            "(emit_nvtx(record_shapes=True)) and module ranges")
    trace.add_argument("--torch-trace", metavar="FILE",
                       help="record the timed iterations with torch.profiler (shapes, CUDA "
                            "activity, module ranges) and export a Chrome trace to FILE")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--no-module-ranges", action="store_true",
                   help="leave out the module::<Class> ranges under --nvtx / --torch-trace")
    return p


def check_sizes(args, **positive):
    for name, value in positive.items():
        if value is None or value <= 0:
            sys.exit(f"--{name.replace('_', '-')} must be a positive integer (got {value})")
    if args.iters <= 0 or args.warmup < 0:
        sys.exit("--iters must be positive and --warmup non-negative")


def setup(args):
    """Seeds every generator and returns (device, dtype)."""
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device is visible (use --device cpu)")
    torch.manual_seed(args.seed)
    return torch.device(args.device), DTYPES[args.dtype]


def random_tokens(shape, high, device, seed):
    """Integer inputs in [0, high) from their own seeded generator (same on CPU and GPU)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g).to(device)


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())


def _nvtx_range(device, name):
    """An NVTX range on CUDA (what `kforge profile --range` selects); nothing on the CPU."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.nvtx.range(name)


def _profiler(args, device):
    if not args.torch_trace:
        return contextlib.nullcontext()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities, record_shapes=True)


def run(model, inputs, args, summary):
    """Runs the model `args.warmup + args.iters` times and prints the summary and the timing.

    model(*inputs) must return the scalar loss. Returns the GPU time of the timed iterations in
    milliseconds (CPU wall time on --device cpu)."""
    device = next(model.parameters()).device
    if args.nvtx and device.type != "cuda":
        sys.exit("--nvtx needs --device cuda")
    if (args.nvtx or args.torch_trace) and not args.no_module_ranges:
        if args.compile:
            print("note: no module ranges with --compile (Inductor fuses across modules)")
        else:
            kforge_ranges.annotate(model)

    optimizer = None
    if args.train:
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    else:
        model.eval()
    forward = torch.compile(model) if args.compile else model

    def step():
        if args.train:
            optimizer.zero_grad(set_to_none=True)
            loss = forward(*inputs)
            loss.backward()
            optimizer.step()
            return loss
        with torch.no_grad():
            return forward(*inputs)

    print(f"{summary}; {'train' if args.train else 'inference'}, {args.iters} timed + "
          f"{args.warmup} warm-up iterations, {args.dtype} on {device}"
          f"{', compiled' if args.compile else ''}")

    nvtx = torch.autograd.profiler.emit_nvtx(record_shapes=True) if args.nvtx \
        else contextlib.nullcontext()
    cuda = device.type == "cuda"
    with nvtx:
        for _ in range(args.warmup):
            with _nvtx_range(device, "step"):
                step()
        if cuda:
            torch.cuda.synchronize()
        with _profiler(args, device) as prof:
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            wall_start = time.perf_counter()
            for _ in range(args.iters):
                # "step" also as a record_function, so that a torch.profiler trace has it too.
                with _nvtx_range(device, "step"), torch.autograd.profiler.record_function("step"):
                    loss = step()
            if cuda:
                end.record()
                torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - wall_start) * 1e3
    if args.torch_trace:
        prof.export_chrome_trace(args.torch_trace)
        print(f"torch trace: {args.torch_trace}")
    loss_value = float(loss.detach().float())
    if cuda:
        gpu_ms = start.elapsed_time(end)
        print(f"loss={loss_value:.4f} mean_step_ms={gpu_ms / args.iters:.3f}")
        print(f"gpu_time_ms={gpu_ms:.3f}")
        return gpu_ms
    print(f"loss={loss_value:.4f} mean_step_ms={wall_ms / args.iters:.3f}")
    print(f"cpu_time_ms={wall_ms:.3f}")
    return wall_ms
