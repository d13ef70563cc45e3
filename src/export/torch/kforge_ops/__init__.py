"""kforge's tuned kernels as PyTorch custom ops, written by `kforge export --target torch`.

    import kforge_ops                       # loads the extension and the exported modules
    y = torch.ops.kforge.rmsnorm(x, w, 1e-6)
    report = kforge_ops.patch(model)        # swap kforge ops into a model; report.undo()
    kforge_ops.stats()                      # calls per op: "kforge", or why they fell back

Every op runs a module kforge checked and timed when its tensors are covered (see
manifest.json), else PyTorch's own composite; both are counted. The ops have fake (meta)
implementations, so torch.compile keeps whole graphs around them, and no backward: taking a
gradient through one is an error, and patched modules use PyTorch's ops while gradients are
being recorded.
"""
import json
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_ROOT = os.path.dirname(_HERE)


with open(os.path.join(_HERE, "manifest.json")) as f:
    manifest = json.load(f)


def _load_extension():
    try:
        from . import _C  # built by `pip install`

        return _C
    except ImportError:
        pass
    # Imported from a directory: build the extension once (cached by PyTorch).
    from torch.utils.cpp_extension import load

    csrc = os.path.join(_PACKAGE_ROOT, "csrc")
    return load(
        name="kforge_ops_C",
        sources=[os.path.join(csrc, "kforge_ops.cpp")],
        extra_include_paths=[csrc],
        extra_ldflags=["-ldl"],
        # The extension is C++ only; naming the export's architecture keeps PyTorch from
        # probing for a GPU to pick one (it fails on a machine without one).
        extra_cuda_cflags=[f"-arch={manifest['arch']}"],
        with_cuda=True,
        verbose=False,
    )


_C = _load_extension()

_ABI_DTYPES = {"f16": 0, "bf16": 1, "f32": 2}

_C.set_device(manifest["device"]["name"])
for _op in manifest["ops"]:
    _C.add_op(_op["op"], [[d["input"], d["dim"], d["rank"]] for d in _op["dispatch_key"]])
for _op in manifest["ops"]:
    _modules = {v["symbol"]: os.path.join(_HERE, "modules", v["module"]) for v in _op["variants"]}
    for _row in _op["rows"]:
        _sizes = [_row["sizes"][d["size"]] for d in _op["dispatch_key"]]
        _C.add_row(_op["op"], _ABI_DTYPES[_op["dtype"]], _sizes, _modules[_row["variant"]], _row["variant"])


def stats():
    """Calls per op since import (or reset_stats): {"rmsnorm": {"kforge": 96, "shape: ...": 2}}."""
    return {op: dict(counts) for op, counts in _C.stats().items()}


def reset_stats():
    _C.reset_stats()


def exported_ops():
    return sorted({op["op"] for op in manifest["ops"]})


def example_inputs(op, sizes, dtype, device="cuda", seed=0):
    """Random arguments for torch.ops.kforge.<op> at `sizes` (a manifest row's "sizes")."""
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=g).to(dtype)

    if op in ("rmsnorm", "reduce", "softmax"):
        m, n = (sizes.get("M") or sizes.get("rows")), (sizes.get("N") or sizes.get("cols"))
        x = randn(m, n)
        return (x, randn(n), 1e-6) if op == "rmsnorm" else (x,)
    if op == "layernorm":
        b, d = sizes["batch"], sizes["dim"]
        return randn(b, d), randn(d), randn(d), 1e-5
    if op == "cross_entropy":
        b, v = sizes["batch"], sizes["vocab"]
        return randn(b, v), torch.randint(0, v, (b,), device=device, generator=g)
    if op in ("rotary_embedding", "rotary_embedding_half"):
        b, h, s, d = sizes["batch"], sizes["heads"], sizes["seq_len"], sizes["head_dim"]
        angles = torch.rand(s, d // 2, device=device, generator=g) * 6.3
        return randn(b, h, s, d), angles.cos().to(dtype), angles.sin().to(dtype)
    if op == "fused_mlp":
        rows, dim, hidden = sizes["batch"], sizes["dim"], sizes["hidden"]
        scale = 1 / dim ** 0.5  # nn.Linear's scale keeps the activations near 1
        return (randn(rows, dim), randn(hidden, dim) * scale, randn(hidden, dim) * scale,
                randn(dim, hidden) / hidden ** 0.5)
    raise ValueError(f"no example inputs for {op}")


# ---- torch.compile: fake implementations (shapes, dtypes and strides) ----
# Every op returns packed (contiguous) tensors, whatever the strides of its inputs.


@torch.library.register_fake("kforge::rmsnorm")
def _(x, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("kforge::layernorm")
def _(x, weight, bias, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("kforge::softmax")
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("kforge::cross_entropy")
def _(logits, targets):
    return logits.new_empty(())


@torch.library.register_fake("kforge::rotary_embedding")
def _(x, cos, sin):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("kforge::rotary_embedding_half")
def _(x, cos, sin):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("kforge::reduce")
def _(x):
    return x.new_empty(x.shape[:-1])


@torch.library.register_fake("kforge::fused_mlp")
def _(x, w_gate, w_up, w_down):
    return x.new_empty((*x.shape[:-1], w_down.shape[0]))


# ---- autograd: none, said clearly ----


def _no_backward(name):
    def backward(ctx, *grads):
        raise RuntimeError(
            f"kforge::{name} has no backward: call it under torch.no_grad() or torch.inference_mode(); "
            "kforge_ops.patch() models use PyTorch's own ops while gradients are recorded"
        )

    return backward


for _name in ("rmsnorm", "layernorm", "softmax", "cross_entropy", "rotary_embedding",
              "rotary_embedding_half", "reduce", "fused_mlp"):
    torch.library.register_autograd(f"kforge::{_name}", _no_backward(_name))

from .patch import patch  # noqa: E402  (needs the ops registered above)

__all__ = ["patch", "stats", "reset_stats", "exported_ops", "example_inputs", "manifest"]
