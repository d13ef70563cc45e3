"""Module ranges: name the composite ops that PyTorch runs as several ATen ops.

An RMSNorm, a rotary embedding or a SwiGLU MLP is not one ATen op, so neither NVTX ranges
from emit_nvtx nor torch.profiler CPU ops say "this was an RMSNorm of [8, 512, 1024]".
annotate(model) wraps the forward of every module of interest in a
torch.autograd.profiler.record_function range named

    module::<ClassName>, sizes = [[d0, d1, ...], ...]

so the range shows in torch.profiler traces (cat "user_annotation") and, under
torch.autograd.profiler.emit_nvtx, as an NVTX range. The sizes are the shapes of the forward's
tensor inputs followed by the module's parameters (recursively, in registration order):

    RMSNorm              [[x...], [dim] weight]
    LayerNorm            [[x...], [dim] weight, [dim] bias]
    SwiGLU               [[x...], [hidden, dim] w_gate, [hidden, dim] w_up, [dim, hidden] w_down]
    Attention            [[x...], then its projection weights (and biases) in registration order]
    CrossEntropyLoss     [[N, V] logits, [N] targets]
    RotaryEmbeddingHalf  [[B, H, S, D] x, [S, D/2] cos, [S, D/2] sin]

A module may define range_operand_shapes(*inputs) to give its own list instead; the rotary
embedding does, since its operands are cos/sin tables (buffers) cut to the sequence length.
A module may also define range_fields() returning {key: value} items that its shapes cannot
say; they go before the sizes, "module::Attention, is_causal = 1, sizes = [...]", and the
planner reads is_causal from there for the attention kernels inside the range.
The rotary module is called once for q and once for k, so each application is one range with
that tensor's shape.

Under emit_nvtx, PyTorch appends its own fields to a range's text (", op_id = N"), so a parser
must read the balanced list after "sizes = " and ignore what follows.
"""

import torch

# Class names whose forward gets a range by default.
DEFAULT_CLASSES = (
    "RMSNorm",
    "LayerNorm",
    "RotaryEmbedding",
    "RotaryEmbeddingHalf",
    "SwiGLU",
    "Attention",
    "CrossEntropyLoss",
)


def format_sizes(shapes):
    """[[2, 8, 64], [64]] as PyTorch writes sizes in NVTX ranges: "[[2, 8, 64], [64]]"."""
    return "[" + ", ".join("[" + ", ".join(str(int(d)) for d in s) + "]" for s in shapes) + "]"


def range_name(class_name, shapes, fields=None):
    items = "".join(f", {key} = {value}" for key, value in (fields or {}).items())
    return f"module::{class_name}{items}, sizes = {format_sizes(shapes)}"


def range_fields(module):
    custom = getattr(module, "range_fields", None)
    return dict(custom()) if callable(custom) else {}


def _tensor_shapes(values):
    """Shapes of the tensors among a forward's positional inputs, in order."""
    shapes = []
    for v in values:
        if isinstance(v, torch.Tensor):
            shapes.append(list(v.shape))
        elif isinstance(v, (list, tuple)):
            shapes.extend(_tensor_shapes(v))
    return shapes


def operand_shapes(module, inputs):
    custom = getattr(module, "range_operand_shapes", None)
    if callable(custom):
        return [list(s) for s in custom(*inputs)]
    return _tensor_shapes(inputs) + [list(p.shape) for p in module.parameters()]


def annotate(model, classes=DEFAULT_CLASSES):
    """Adds a record_function range around the forward of every submodule (model included)
    whose class name is in `classes`. Returns the hook handles; call .remove() on each to undo."""
    handles = []
    wanted = set(classes)
    for module in model.modules():
        name = type(module).__name__
        if name not in wanted:
            continue
        open_ranges = []  # a stack: a module may be re-entered (the rotary one is not, but may be)

        def enter(mod, inputs, _name=name, _open=open_ranges):
            rf = torch.autograd.profiler.record_function(
                range_name(_name, operand_shapes(mod, inputs), range_fields(mod)))
            rf.__enter__()
            _open.append(rf)

        def leave(mod, inputs, output, _open=open_ranges):
            if _open:
                _open.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(enter))
        try:
            # always_call: close the range even when forward raises.
            handles.append(module.register_forward_hook(leave, always_call=True))
        except TypeError:  # PyTorch before 2.0
            handles.append(module.register_forward_hook(leave))
    return handles
