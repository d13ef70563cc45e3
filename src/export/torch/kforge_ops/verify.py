"""Does a patched model give the same outputs, and how much faster is a step?

    python3 -m kforge_ops.verify --model hf:llama [--plan PLAN.json] [--json OUT]
    (or `kforge verify --export DIR --model hf:llama ...`, which runs this)

Runs the model as built (eager), patched with kforge ops (eager + kforge), torch.compile'd, and
patched then compiled, on the same inputs under torch.inference_mode(). Correctness is judged
against the same model in f32 (its weights upcast): each output (logits, loss) as
max |a - b| / max |a| from the f32 model's. A patched output passes when that distance is within
the dtype's tolerance, or within twice the distance of PyTorch's own output in that dtype
(eager for the patched model, compiled for the patched compiled one): kforge may not be less
accurate than PyTorch is in the dtype. Its distance from the unpatched model is printed too. Step time: the mean of --iters steps after warm-up,
timed with CUDA events, the same way for all four. With --plan (`kforge plan --json`), the gain
predicted for the swapped ops is printed beside the measured one: the plan's kernel time minus,
for each swapped op's group, its time in the profile less calls x the exported op's time at that
shape (timed here, alone); and again with the work a swap leaves in place added back (the
residual add of a fused residual_add+rmsnorm group, the packing copy of a RoPE input).

Models: hf:llama, hf:qwen2, hf:mistral (transformers, built from configs with random weights,
as python/examples/hf_model.py) and example:llama (python/examples/llama.py).
"""
import argparse
import copy
import gc
import statistics
import json
import os
import sys
import time

import torch

import kforge_ops

TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def build_model(name, examples_dir, layers, batch, seq, dtype, device):
    """(model, inputs, outputs(model, inputs) -> (logits or None, loss))"""
    sys.path.insert(0, examples_dir)
    torch.manual_seed(0)
    kind, _, which = name.partition(":")
    if kind == "hf":
        import hf_model

        model, vocab, default_seq = hf_model.build(which, layers)
        seq = seq or default_seq
        model.config._attn_implementation = "sdpa"
        model = model.to(device, dtype).eval()
        ids = torch.randint(0, vocab, (batch, seq), device=device)
        inputs = {"input_ids": ids, "labels": ids}

        def outputs(m, x):
            out = m(**x)
            return out.logits, out.loss

        return model, inputs, outputs
    if name == "example:llama":
        import llama

        seq = seq or 512
        model = llama.Llama(16384, seq, 1024, layers, 16, 16, 2816).to(device, dtype).eval()
        tokens = torch.randint(0, 16384, (batch, seq), device=device)
        inputs = {"tokens": tokens, "targets": torch.roll(tokens, -1, 1)}

        def outputs(m, x):
            return None, m(**x)

        return model, inputs, outputs
    sys.exit(f"unknown model {name!r}: hf:llama, hf:qwen2, hf:mistral or example:llama")


def distance(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item()


def step_ms(fn, iters, rounds=5):
    """The mean step time of each of `rounds` runs of `iters` steps, after `iters` warm-up steps
    (a model just compiled runs slower for its first few steps),
    with Python's garbage collector held off while timing (a collection over the compiled
    graphs' objects otherwise lands in some runs): CUDA events on a GPU, the host clock on the
    CPU (a smoke test, not a measurement)."""
    for _ in range(iters):
        fn()
    times = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            if torch.cuda.is_available():
                times.append(gpu_ms_per_call(fn, iters))
            else:
                began = time.perf_counter()
                for _ in range(iters):
                    fn()
                times.append((time.perf_counter() - began) * 1e3 / iters)
    finally:
        gc.enable()
    return times


def kforge_us_per_call(op, sizes, dtype):
    """The exported op alone at `sizes`: mean time per call on the GPU (CUDA events)."""
    args = kforge_ops.example_inputs(op, sizes, dtype)
    fn = getattr(torch.ops.kforge, op)
    return torch_us_per_call(lambda: fn(*args))


def host_issue_ms(fn, repeats=5):
    """The host's time to issue one step with the GPU idle at its start (median of `repeats`):
    a step whose host time reaches its GPU step time is host-bound, and a faster kernel cannot
    make it faster."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def gpu_ms_per_call(fn, iters):
    """The mean GPU time of `iters` calls of fn issued back to back (CUDA events)."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def torch_us_per_call(fn, iters=50):
    for _ in range(5):
        fn()
    return gpu_ms_per_call(fn, iters) * 1e3


def left_in_place_us(group, sizes, dtype):
    """The work a swap of this plan group leaves or adds beside the kforge op, timed alone: the
    residual add of a fused residual_add+rmsnorm group (kforge's rmsnorm does not add), and the
    packing copy of a RoPE input (patched RoPE gets a transposed view). 0 for anything else."""
    if group["op"] == "rmsnorm" and group.get("name", "").startswith("residual_add+"):
        a = torch.randn(sizes["M"], sizes["N"], device="cuda").to(dtype)
        b = torch.randn_like(a)
        return torch_us_per_call(lambda: a + b)
    if group["op"] == "rotary_embedding_half":
        x = torch.randn(sizes["batch"], sizes["seq_len"], sizes["heads"], sizes["head_dim"],
                        device="cuda").to(dtype).transpose(1, 2)
        return torch_us_per_call(lambda: x.contiguous())
    return 0.0


def predicted_gain(plan, swapped_ops):
    """The plan's step with each swapped op's groups at the exported op's time at that shape
    (measured here, alone): plan kernel time / (kernel time - what those groups would save).
    Also the same with the work each swap leaves in place added back (left_in_place_us)."""
    rows = {}
    for op in kforge_ops.manifest["ops"]:
        for row in op["rows"]:
            rows[(op["op"], op["dtype"], row["shape"])] = row["sizes"]
    total = plan["kernel_time_ns"]
    saved = 0.0
    saved_net = 0.0
    used = []
    for g in plan["groups"]:
        key = (g.get("op"), g.get("dtype"), g.get("shape"))
        if g.get("op") not in swapped_ops or key not in rows:
            continue
        dtype = DTYPES[g["dtype"]]
        kforge_us = kforge_us_per_call(g["op"], rows[key], dtype)
        beside_us = left_in_place_us(g, rows[key], dtype)
        saved += max(0.0, g["time_ns"] - g["calls"] * kforge_us * 1e3)
        saved_net += max(0.0, g["time_ns"] - g["calls"] * (kforge_us + beside_us) * 1e3)
        used.append({"op": g["op"], "group": g.get("name"), "shape": g["shape"], "calls": g["calls"],
                     "measured_us_per_call": g["time_ns"] / g["calls"] / 1e3,
                     "kforge_us_per_call": kforge_us, "left_in_place_us_per_call": beside_us})
    gain = lambda s: total / (total - s) if s > 0 else 1.0  # noqa: E731
    return gain(saved), gain(saved_net), used


def faster(times, than):
    """Whether step times `times` beat `than` beyond both spreads: every round faster, and the
    median by more than 1%."""
    return max(times) < min(than) and statistics.median(times) < 0.99 * statistics.median(than)


def compile_model(model, mode):
    torch._dynamo.reset()
    return torch.compile(model, mode=mode) if mode else torch.compile(model)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--examples-dir", default=os.environ.get("KFORGE_EXAMPLES_DIR", ""))
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--compile-mode", default=None, help="torch.compile's mode (default: its default)")
    p.add_argument("--compiled-ops", default="auto",
                   help="the swaps made in the model that is compiled: auto (those measured faster "
                        "there), all, or a comma-separated list of ops")
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test of the patching")
    p.add_argument("--plan", help="kforge plan --json of this model: the predicted gain")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args()
    dtype = DTYPES[args.dtype]
    model, inputs, outputs = build_model(args.model, args.examples_dir, args.layers, args.batch,
                                         args.seq, dtype, args.device)
    on_gpu = args.device.startswith("cuda")
    result = {"model": args.model, "dtype": args.dtype, "batch": args.batch, "layers": args.layers,
              "device": torch.cuda.get_device_name() if on_gpu else args.device,
              "torch": torch.__version__, "compile_mode": args.compile_mode or "default",
              "export": kforge_ops.manifest.get("device_key"),
              "kforge_git_sha": kforge_ops.manifest.get("run", {}).get("kforge_git_sha"),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    run = lambda m: lambda: outputs(m, inputs)  # noqa: E731
    mean = statistics.median  # of the rounds: a step time robust to one disturbed round
    with torch.inference_mode():
        f32_model = copy.deepcopy(model).float()
        f32_logits, f32_loss = outputs(f32_model, inputs)
        del f32_model
        ref_logits, ref_loss = outputs(model, inputs)
        eager_ms = step_ms(run(model), args.iters)
        host_ms = {"eager": host_issue_ms(run(model))} if on_gpu else {}
        compiled = compile_model(model, args.compile_mode)
        c_logits, c_loss = outputs(compiled, inputs)
        compile_ms = step_ms(run(compiled), args.iters)
        if on_gpu:
            host_ms["compile"] = host_issue_ms(run(compiled))

        report = kforge_ops.patch(model, verbose=False)
        swapped_ops = sorted({op.split("::")[1] for _, _, op in report.swapped})
        kforge_ops.reset_stats()
        k_logits, k_loss = outputs(model, inputs)
        calls = kforge_ops.stats()
        kforge_ms = step_ms(run(model), args.iters)
        if on_gpu:
            host_ms["eager_kforge"] = host_issue_ms(run(model))
        # torch.compile + kforge: the model with every swap compiled, then with one swap at a
        # time. A model that will be compiled gets, with --compiled-ops auto, the swaps that
        # alone made the compiled model faster beyond both spreads (every round faster, the
        # median by more than 1%); that model is compiled and timed afresh (with no such swap, it
        # is the unpatched model, whose time is compile's).
        compiled_all = compile_model(model, args.compile_mode)
        outputs(compiled_all, inputs)  # compiles
        kforge_ops.reset_stats()
        ck_logits, ck_loss = outputs(compiled_all, inputs)
        calls_compiled = kforge_ops.stats()
        compile_all_ms = step_ms(run(compiled_all), args.iters)
        report.undo()
        compile_one_op_ms = {}
        if len(swapped_ops) == 1:
            compile_one_op_ms[swapped_ops[0]] = compile_all_ms
        else:
            for op in swapped_ops:
                one = kforge_ops.patch(model, verbose=False, ops=[op])
                compile_one_op_ms[op] = step_ms(run(compile_model(model, args.compile_mode)), args.iters)
                one.undo()
        rejected = []
        if args.compiled_ops == "auto":
            kept = [op for op, t in compile_one_op_ms.items() if faster(t, compile_ms)]
        elif args.compiled_ops == "all":
            kept = swapped_ops
        else:
            kept = [op for op in args.compiled_ops.split(",") if op]
        # With auto, the chosen swaps must also beat compile together: compile is timed again
        # right after them (A B A), and the swaps are kept only if faster than both of its
        # timings, as each was alone; else the model is compiled unpatched.
        compile_again_ms = None
        if kept:
            chosen = kforge_ops.patch(model, verbose=False, ops=kept)
            compiled_k = compile_model(model, args.compile_mode)
            compile_kforge_ms = step_ms(run(compiled_k), args.iters)
            if on_gpu:
                host_ms["compile_kforge"] = host_issue_ms(run(compiled_k))
            chosen.undo()
            if args.compiled_ops == "auto":
                compile_again_ms = step_ms(run(compile_model(model, args.compile_mode)), args.iters)
                if not all(faster(compile_kforge_ms, t) for t in (compile_ms, compile_again_ms)):
                    print(f"compile + kforge with {', '.join(kept)}: {mean(compile_kforge_ms):.3f} ms, "
                          f"not faster than compile ({mean(compile_ms):.3f} and "
                          f"{mean(compile_again_ms):.3f} ms): compiled unpatched", flush=True)
                    rejected = kept
                    kept = []
        if not kept:
            # No swap: the model compiled is the unpatched one, already timed as "compile".
            compile_kforge_ms = compile_ms
            host_ms.pop("compile_kforge", None)

    tol = TOLERANCE[dtype]
    # name -> (output, PyTorch's own output it is judged beside), per output the model has.
    judged = {"loss": (k_loss, ref_loss), "loss_compiled": (ck_loss, c_loss)}
    if ref_logits is not None:
        judged.update({"logits": (k_logits, ref_logits), "logits_compiled": (ck_logits, c_logits)})
    f32_outputs = {"loss": f32_loss, "logits": f32_logits}
    checks = {}
    for name, (patched, own) in judged.items():
        f32 = f32_outputs[name.split("_")[0]]
        error, own_error = distance(f32, patched), distance(f32, own)
        bound = max(tol, 2 * own_error)
        checks[name] = {"vs_f32": error, "pytorch_vs_f32": own_error, "bound": bound,
                        "vs_unpatched": distance(own, patched), "pass": error <= bound}
    passed = all(c["pass"] for c in checks.values())
    step = {"eager": eager_ms, "eager_kforge": kforge_ms, "compile": compile_ms,
            "compile_kforge": compile_kforge_ms, "compile_kforge_all_ops": compile_all_ms}
    if compile_again_ms is not None:
        step["compile_again"] = compile_again_ms
    result.update({"tolerance": tol, "checks": checks, "pass": passed,
                   "swapped": [list(s) for s in report.swapped],
                   "not_swapped": [list(s) for s in report.not_swapped],
                   "calls": calls, "calls_compiled_all_ops": calls_compiled,
                   "step_ms": {k: mean(v) for k, v in step.items()},
                   "step_ms_rounds": step, "host_issue_ms": host_ms,
                   "compile_kforge_one_op_ms": {k: mean(v) for k, v in compile_one_op_ms.items()},
                   "compiled_ops": kept, "compiled_ops_rejected_together": rejected,
                   "speedup": {"eager_kforge_vs_eager": mean(eager_ms) / mean(kforge_ms),
                               "compile_kforge_vs_compile": mean(compile_ms) / mean(compile_kforge_ms)}})
    if args.plan and not on_gpu:
        print("--plan: the predicted gain needs the GPU; left out")
    elif args.plan:
        with open(args.plan) as f:
            plan = json.load(f)
        with torch.inference_mode():
            gain, gain_net, used = predicted_gain(plan, swapped_ops)
        result["predicted"] = {"eager_kforge_vs_eager": gain,
                               "eager_kforge_vs_eager_with_work_left_in_place": gain_net,
                               "groups": used}

    print(report)
    print(f"calls: {json.dumps(calls)}")
    print(f"calls, compiled with every swap: {json.dumps(calls_compiled)}")
    print(f"{args.model} {args.dtype} batch {args.batch}, {args.layers} layers on {result['device']}")
    print(f"  distance from the f32 model (max |a - b| / max |a|); bound: {tol:.0e} or twice PyTorch's own")
    for name, c in checks.items():
        print(f"  {name:<16} kforge {c['vs_f32']:.2e}  PyTorch {c['pytorch_vs_f32']:.2e}  "
              f"bound {c['bound']:.2e}  {'pass' if c['pass'] else 'FAIL'}  "
              f"(from the unpatched: {c['vs_unpatched']:.2e})")
    print(f"  correctness: {'PASS' if passed else 'FAIL'}")
    for name, times in step.items():
        host = f"  host {host_ms[name]:.3f} ms to issue" if name in host_ms else ""
        print(f"  {name:<16} {mean(times):8.3f} ms  ({' / '.join(f'{t:.3f}' for t in times)}){host}")
    for op, times in compile_one_op_ms.items():
        print(f"  compile + kforge {op} only: {mean(times):8.3f} ms  "
              f"({mean(compile_ms) / mean(times):.3f}x compile)")
    for g in result.get("predicted", {}).get("groups", []):
        print(f"  plan group {g['group']} {g['shape']}: {g['measured_us_per_call']:.1f} us per call "
              f"in the profile, kforge alone {g['kforge_us_per_call']:.1f} us"
              + (f" + {g['left_in_place_us_per_call']:.1f} us left in place" if g['left_in_place_us_per_call'] else ""))
    print(f"  eager + kforge:   {result['speedup']['eager_kforge_vs_eager']:.3f}x eager"
          + (f" (predicted {result['predicted']['eager_kforge_vs_eager']:.3f}x; with the work each swap "
             f"leaves in place, {result['predicted']['eager_kforge_vs_eager_with_work_left_in_place']:.3f}x)"
             if "predicted" in result else ""))
    why_none = (f"no op ({', '.join(rejected)} each beat compile alone, not together)" if rejected
                else "no op (compiled, each was as fast or faster without)")
    print(f"  compile + kforge: {result['speedup']['compile_kforge_vs_compile']:.3f}x compile, swapped "
          f"before compiling: {', '.join(kept) or why_none}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
