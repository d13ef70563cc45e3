"""A KernelBench-format problem as kforge's reference: the problem's own PyTorch `Model`.

    python3 kernelbench_problem.py PROBLEM.py --channel IN,OUT [--device cuda|cpu]

kforge starts this as a child (src/kernelbench/kernelbench_op.cpp) and talks to it in JSON
lines over the two private descriptors; whatever the problem prints goes to the child's log.

The problem file (docs/kernelbench.md) defines `Model`, `get_inputs()` and `get_init_inputs()`,
and may set `KFORGE_OP` (the kforge op whose signature the problem has). The kernel's inputs are
get_inputs()'s tensors followed by the Model's parameters (named_parameters order); its outputs
are what forward returns.

Requests (one JSON object a line) and what each does:
  {"cmd": "describe"}                 the tensors: name, shape, dtype, role; the problem's dtype
  {"cmd": "inputs", "seed": S, "dir": D}
                                      torch.manual_seed(S); the Model built (its parameters
                                      drawn) and get_inputs() called; each tensor written raw,
                                      in its own dtype, to D/in<i>.bin
  {"cmd": "forward", "dir": D}        reads D/in<i>.bin as float64 (integer tensors as int64),
                                      runs the Model in float64 on those inputs and parameters,
                                      writes each output as float64 to D/out<i>.bin
  {"cmd": "time", "module": M, "entry": E, "seed": S, "max_seconds": T, "scalars": [...],
   "abi_version": V, "atol": A, "rtol": R}
                                      times the Model eager, under torch.compile, and kforge's
                                      compiled kernel M (symbol E) called on the same tensors, by
                                      one method (CUDA events around one call, on fresh values,
                                      after the L2 cache was flushed); then compares the kernel's
                                      last output with the Model's in float64
Every reply is {"ok": true, ...} or {"ok": false, "error": "..."}.
"""
import argparse
import copy
import importlib.util
import inspect
import json
import os
import pathlib
import statistics
import sys
import time
import traceback

import torch

# The ABI mirror and the timer bench/peers uses: one method for kforge, eager and compile.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
from kforge_call import Timer, bind_entry  # noqa: E402

DTYPE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32",
               torch.float64: "f64", torch.int32: "i32", torch.int64: "i64"}


def load_problem(path):
    spec = importlib.util.spec_from_file_location("kernelbench_problem_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, name):
            raise ValueError(f"{path} defines no {name} (a KernelBench problem needs Model, "
                             "get_inputs and get_init_inputs)")
    return module


class Problem:
    def __init__(self, path, device):
        self.module = load_problem(path)
        self.device = device

    def build(self, seed):
        """The Model (parameters drawn after seeding) and its inputs, on the device."""
        torch.manual_seed(seed)
        model = self.module.Model(*self.module.get_init_inputs()).to(self.device).eval()
        inputs = [t.to(self.device) if torch.is_tensor(t) else t
                  for t in self.module.get_inputs()]
        for i, t in enumerate(inputs):
            if not torch.is_tensor(t):
                raise ValueError(f"get_inputs()[{i}] is a {type(t).__name__}: kforge passes "
                                 "tensors only (put fixed values in the Model)")
        return model, inputs

    def kernel_tensors(self, model, inputs):
        """get_inputs()'s tensors, then the Model's parameters: the kernel's inputs in order."""
        params = [(name.replace(".", "_"), p.detach()) for name, p in model.named_parameters()]
        names = forward_argument_names(model, len(inputs))
        return [(n, t, "input") for n, t in zip(names, inputs)] + \
            [(n, t, "parameter") for n, t in params]

    def describe(self):
        model, inputs = self.build(0)
        tensors = self.kernel_tensors(model, inputs)
        with torch.no_grad():
            outputs = as_outputs(model(*inputs))
        floats = {t.dtype for _, t, _ in tensors if t.is_floating_point()}
        if len(floats) > 1:
            raise ValueError(f"the problem's floating tensors mix dtypes {sorted(map(str, floats))}: "
                             "kforge compiles a kernel for one")
        described = [{"name": n, "shape": list(t.shape), "dtype": dtype_name(t.dtype),
                      "role": role} for n, t, role in tensors]
        described += [{"name": "out" if len(outputs) == 1 else f"out{i}",
                       "shape": list(t.shape), "dtype": dtype_name(t.dtype), "role": "output"}
                      for i, t in enumerate(outputs)]
        op = getattr(self.module, "KFORGE_OP", None)
        return {"tensors": described, "op": op,
                "dtype": dtype_name(floats.pop()) if floats else "f32"}

    def write_inputs(self, seed, folder):
        model, inputs = self.build(seed)
        for i, (_, t, _) in enumerate(self.kernel_tensors(model, inputs)):
            write_raw(t, os.path.join(folder, f"in{i}.bin"))
        return {}

    def forward(self, folder):
        """The Model in float64 on the inputs kforge gives (which may be its own adversarial
        draws, not get_inputs()'s)."""
        model, inputs = self.build(0)
        tensors = self.kernel_tensors(model, inputs)
        read = []
        for i, (_, t, _) in enumerate(tensors):
            wide = torch.float64 if t.is_floating_point() else torch.int64
            data = torch.from_file(os.path.join(folder, f"in{i}.bin"), size=t.numel(),
                                   dtype=wide)
            read.append(data.reshape(t.shape).to(self.device).to(
                torch.float64 if t.is_floating_point() else t.dtype))
        model = model.double()
        given_inputs, given_params = read[:len(inputs)], read[len(inputs):]
        with torch.no_grad():
            for (_, p), value in zip(model.named_parameters(), given_params):
                p.copy_(value)
            outputs = as_outputs(model(*given_inputs))
        for i, out in enumerate(outputs):
            write_raw(out.to(torch.float64), os.path.join(folder, f"out{i}.bin"))
        return {}

    def time(self, module, entry, seed, max_seconds, scalars, abi_version, atol, rtol):
        """Each timed call runs on freshly drawn values (every floating tensor, parameters too,
        refilled in place outside the timed region), so nothing can be reused across calls;
        after the timing the kernel's output on the last draw is compared with the Model's, in
        float64, at ten times the op's tolerance (relative to the larger of each value and the
        output's rms)."""
        model, inputs = self.build(seed)
        tensors = [t for _, t, _ in self.kernel_tensors(model, inputs)]
        with torch.no_grad():
            expected = as_outputs(model(*inputs))
        outputs = [torch.full_like(e, float("nan")) if e.is_floating_point() else
                   torch.zeros_like(e) for e in expected]
        cuda = self.device == "cuda"
        stream = torch.cuda.current_stream().cuda_stream if cuda else None
        kernel = bind_entry(module, entry, tensors, outputs,
                            [dtype_name(t.dtype) for t in tensors + outputs], stream, scalars,
                            abi_version)
        # Redrawn at each tensor's own scale (a weight drawn at 1/sqrt(fan_in) stays so).
        floating = [(t, float(t.float().std()) if t.numel() > 1 else 1.0)
                    for t in tensors if t.is_floating_point()]

        def redraw():
            with torch.no_grad():
                for t, scale in floating:
                    t.normal_(0.0, scale or 1.0)
        timer = (Timer(torch, torch.cuda.get_device_properties(0).L2_cache_size,
                       max_seconds=max_seconds, redraw=redraw)
                 if cuda else HostTimer(max_seconds, redraw))
        if cuda:
            timer.cold_tensors = tensors + outputs
        with torch.no_grad():
            eager = timer.time_us(lambda: model(*inputs))
            torch._dynamo.reset()
            compiled = torch.compile(model, mode="max-autotune-no-cudagraphs" if cuda else None,
                                     dynamic=False)
            compiled(*inputs)
            synchronize(self.device)
            compile_time = timer.time_us(lambda: compiled(*inputs))
            kforge_time = timer.time_us(kernel)
            synchronize(self.device)
            wide = copy.deepcopy(model).double()
            reference = as_outputs(wide(*[t.double() if t.is_floating_point() else t
                                          for t in inputs]))
        # Each element's tolerance scales with the larger of its value and the output's rms: a
        # sum or a product's rounding follows its terms, not its possibly cancelled value.
        worst = 0.0
        for o, r in zip(outputs, reference):
            rms = float(r.pow(2).mean().sqrt()) if r.numel() else 0.0
            excess = (o.double() - r).abs() - 10 * (atol + rtol * r.abs().clamp(min=rms))
            worst = max(worst, float(excess.max()) if excess.numel() else 0.0)
            if torch.isnan(o).any():
                worst = float("inf")
        return {"kforge": kforge_time["median_us"], "eager": eager["median_us"],
                "compile": compile_time["median_us"],
                "agrees_after_timing": worst <= 0, "excess_over_tolerance": worst,
                "device": torch.cuda.get_device_name() if cuda else "cpu",
                "torch": torch.__version__}


def forward_argument_names(model, count):
    try:
        names = [p for p in inspect.signature(model.forward).parameters][:count]
    except (TypeError, ValueError):
        names = []
    return names + [f"in{i}" for i in range(len(names), count)]


def as_outputs(result):
    outputs = list(result) if isinstance(result, (tuple, list)) else [result]
    for i, o in enumerate(outputs):
        if not torch.is_tensor(o):
            raise ValueError(f"forward's output {i} is a {type(o).__name__}, not a tensor")
    return [o.contiguous() for o in outputs]


def dtype_name(dtype):
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype {dtype} has no kforge equivalent")
    return DTYPE_NAMES[dtype]


def write_raw(tensor, path):
    tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tofile(path)


class HostTimer:
    """CPU problems: the median of wall-clock times of single calls, each on fresh values."""

    def __init__(self, max_seconds, redraw, min_samples=5):
        self.max_seconds, self.min_samples, self.redraw = max_seconds, min_samples, redraw

    def time_us(self, fn):
        fn()
        samples, start_wall = [], time.perf_counter()
        while len(samples) < self.min_samples or time.perf_counter() - start_wall < self.max_seconds:
            self.redraw()
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e6)
            if len(samples) >= 1000:
                break
        return {"median_us": statistics.median(samples)}


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def serve(problem, channel_in, channel_out):
    handlers = {
        "describe": lambda r: problem.describe(),
        "inputs": lambda r: problem.write_inputs(int(r["seed"]), r["dir"]),
        "forward": lambda r: problem.forward(r["dir"]),
        "time": lambda r: problem.time(r["module"], r["entry"], int(r.get("seed", 0)),
                                       float(r.get("max_seconds", 1.0)), r.get("scalars", []),
                                       int(r.get("abi_version", 1)), float(r["atol"]),
                                       float(r["rtol"])),
    }
    for line in channel_in:
        try:
            request = json.loads(line)
            reply = {"ok": True, **handlers[request["cmd"]](request)}
        except Exception as e:  # the problem's own errors go back to kforge, which names them
            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        channel_out.write(json.dumps(reply) + "\n")
        channel_out.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("problem")
    parser.add_argument("--channel", required=True, help="IN,OUT descriptors (kforge's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    fd_in, fd_out = (int(x) for x in args.channel.split(","))
    channel_in = os.fdopen(fd_in, "r")
    channel_out = os.fdopen(fd_out, "w")
    try:
        problem = Problem(args.problem, args.device)
    except Exception as e:
        traceback.print_exc()
        channel_out.write(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}) + "\n")
        channel_out.flush()
        return 1
    channel_out.write(json.dumps({"ok": True, "ready": True, "device": args.device}) + "\n")
    channel_out.flush()
    serve(problem, channel_in, channel_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
