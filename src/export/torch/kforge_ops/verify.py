"""Does a patched model give the same outputs, and how much faster is a step?

    python3 -m kforge_ops.verify --model hf:llama [--plan PLAN.json] [--json OUT]
    (or `kforge verify --export DIR --model hf:llama ...`, which runs this)

Runs the model as built (eager), patched with kforge ops (eager + kforge), torch.compile'd, and
patched then compiled, on the same inputs under torch.inference_mode(). Correctness: the patched
model's logits and loss against the original's, each as max |a - b| / max |a|, within the
dtype's stated tolerance (and the compiled model's own distance from eager is printed beside it,
as the scale of a harmless difference). Step time: the mean of --iters steps after warm-up,
timed with CUDA events, the same way for all four. With --plan (`kforge plan --json`), the gain
predicted for the swapped ops is printed beside the measured one: the plan's step time minus,
for each swapped op's group, its measured time less calls x the exported variant's tuned time.

Models: hf:llama, hf:qwen2, hf:mistral (transformers, built from configs with random weights,
as python/examples/hf_model.py) and example:llama (python/examples/llama.py).
"""
import argparse
import json
import os
import sys
import time

import torch

import kforge_ops

TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def build_model(name, examples_dir, layers, batch, seq, dtype):
    """(model, inputs, outputs(model, inputs) -> (logits or None, loss))"""
    sys.path.insert(0, examples_dir)
    torch.manual_seed(0)
    kind, _, which = name.partition(":")
    if kind == "hf":
        import hf_model

        model, vocab, default_seq = hf_model.build(which, layers)
        seq = seq or default_seq
        model.config._attn_implementation = "sdpa"
        model = model.to("cuda", dtype).eval()
        ids = torch.randint(0, vocab, (batch, seq), device="cuda")
        inputs = {"input_ids": ids, "labels": ids}

        def outputs(m, x):
            out = m(**x)
            return out.logits, out.loss

        return model, inputs, outputs
    if name == "example:llama":
        import llama

        seq = seq or 512
        model = llama.Llama(16384, seq, 1024, layers, 16, 16, 2816).to("cuda", dtype).eval()
        tokens = torch.randint(0, 16384, (batch, seq), device="cuda")
        inputs = {"tokens": tokens, "targets": torch.roll(tokens, -1, 1)}

        def outputs(m, x):
            return None, m(**x)

        return model, inputs, outputs
    sys.exit(f"unknown model {name!r}: hf:llama, hf:qwen2, hf:mistral or example:llama")


def distance(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item()


def step_ms(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def predicted_gain(plan, swapped_ops):
    """The plan's step with each swapped op's groups at the exported variants' tuned times."""
    tuned = {}
    for op in kforge_ops.manifest["ops"]:
        times = {v["symbol"]: v["tuned_us"] for v in op["variants"]}
        for row in op["rows"]:
            tuned[(op["op"], op["dtype"], row["shape"])] = times[row["variant"]]
    total = plan["kernel_time_ns"]
    saved = 0.0
    used = []
    for g in plan["groups"]:
        key = (g.get("op"), g.get("dtype"), g.get("shape"))
        if g.get("op") not in swapped_ops or key not in tuned or tuned[key] is None:
            continue
        new_ns = g["calls"] * tuned[key] * 1e3
        saved += max(0.0, g["time_ns"] - new_ns)
        used.append({"op": g["op"], "shape": g["shape"], "calls": g["calls"],
                     "measured_us_per_call": g["time_ns"] / g["calls"] / 1e3,
                     "tuned_us": tuned[key]})
    return (total / (total - saved) if saved > 0 else 1.0), used


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--examples-dir", default=os.environ.get("KFORGE_EXAMPLES_DIR", ""))
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--compile-mode", default="max-autotune-no-cudagraphs")
    p.add_argument("--plan", help="kforge plan --json of this model: the predicted gain")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args()
    dtype = DTYPES[args.dtype]
    model, inputs, outputs = build_model(args.model, args.examples_dir, args.layers, args.batch,
                                         args.seq, dtype)
    result = {"model": args.model, "dtype": args.dtype, "batch": args.batch, "layers": args.layers,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "export": kforge_ops.manifest.get("device_key"),
              "kforge_git_sha": kforge_ops.manifest.get("run", {}).get("kforge_git_sha"),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with torch.inference_mode():
        ref_logits, ref_loss = outputs(model, inputs)
        compiled = torch.compile(model, mode=args.compile_mode)
        c_logits, c_loss = outputs(compiled, inputs)
        eager_ms = step_ms(lambda: outputs(model, inputs), args.iters)
        compile_ms = step_ms(lambda: outputs(compiled, inputs), args.iters)

        report = kforge_ops.patch(model, verbose=False)
        kforge_ops.reset_stats()
        k_logits, k_loss = outputs(model, inputs)
        calls = kforge_ops.stats()
        kforge_ms = step_ms(lambda: outputs(model, inputs), args.iters)
        torch._dynamo.reset()
        compiled_k = torch.compile(model, mode=args.compile_mode)
        ck_logits, ck_loss = outputs(compiled_k, inputs)
        compile_kforge_ms = step_ms(lambda: outputs(compiled_k, inputs), args.iters)

    tol = TOLERANCE[dtype]
    checks = {"loss": distance(ref_loss, k_loss), "loss_compiled": distance(ref_loss, ck_loss),
              "loss_compile_vs_eager": distance(ref_loss, c_loss)}
    if ref_logits is not None:
        checks.update({"logits": distance(ref_logits, k_logits),
                       "logits_compiled": distance(ref_logits, ck_logits),
                       "logits_compile_vs_eager": distance(ref_logits, c_logits)})
    passed = all(v <= tol for k, v in checks.items() if "vs_eager" not in k)
    swapped_ops = sorted({op.split("::")[1] for _, _, op in report.swapped})
    result.update({"tolerance": tol, "checks": checks, "pass": passed,
                   "swapped": [list(s) for s in report.swapped],
                   "not_swapped": [list(s) for s in report.not_swapped],
                   "calls": calls,
                   "step_ms": {"eager": eager_ms, "eager_kforge": kforge_ms,
                               "compile": compile_ms, "compile_kforge": compile_kforge_ms},
                   "speedup": {"eager_kforge_vs_eager": eager_ms / kforge_ms,
                               "compile_kforge_vs_compile": compile_ms / compile_kforge_ms}})
    if args.plan:
        with open(args.plan) as f:
            gain, used = predicted_gain(json.load(f), swapped_ops)
        result["predicted"] = {"eager_kforge_vs_eager": gain, "groups": used}

    print(report)
    print(f"calls: {json.dumps(calls)}")
    print(f"{args.model} {args.dtype} batch {args.batch}, {args.layers} layers on {result['device']}")
    for name, value in checks.items():
        print(f"  {name:<26} {value:.2e}" + ("" if "vs_eager" in name else f"  (tolerance {tol:.0e})"))
    print(f"  correctness: {'PASS' if passed else 'FAIL'}")
    for name, ms in result["step_ms"].items():
        print(f"  {name:<16} {ms:8.3f} ms")
    print(f"  eager + kforge:   {result['speedup']['eager_kforge_vs_eager']:.3f}x eager"
          + (f" (predicted {result['predicted']['eager_kforge_vs_eager']:.3f}x)" if args.plan else ""))
    print(f"  compile + kforge: {result['speedup']['compile_kforge_vs_compile']:.3f}x compile")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
