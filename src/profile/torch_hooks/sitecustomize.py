"""kforge's PyTorch hooks: what `kforge profile --torch` adds to every Python process it runs.

kforge puts the directory holding this file first on PYTHONPATH and sets KFORGE_TORCH_HOOKS=1,
so Python imports it at start-up, before the user's script, without any change to that script.
Nothing happens until the program imports torch; then two things are switched on:

1. A range per module call. Every nn.Module call pushes an NVTX range

       module::<Class>, name = <qualified name>, is_causal = 1, sizes = [[...], ...],
       types = [...]

   around its forward: the sizes and dtypes of its tensor arguments (positional, then keyword,
   tuples and lists flattened, None left out), followed by its parameters (recursively, in
   registration order) when it has at most MAX_PARAMETERS of them. The name is the module's path
   from the outermost module called ("model.layers.0.mlp"); is_causal is there when the module
   has a boolean attribute of that name (Hugging Face attention modules do). This gives kforge
   the module hierarchy of a Hugging Face model as it is.
2. PyTorch's own op ranges with input sizes (torch.autograd.profiler.emit_nvtx with
   record_shapes=True), from the first module call that finds CUDA initialized, so a program
   that never uses CUDA is not made to.

Under torch.compile (while Dynamo traces) no module range is pushed: compiled code runs fused
kernels that no module owns. Any sitecustomize that was shadowed by this one is imported after.
"""

import importlib
import importlib.abc
import importlib.util
import os
import sys

# A container module (a decoder layer, the whole model) lists no parameters: its ops are
# recognized by their own ranges, and hundreds of weight shapes would only lengthen its range.
MAX_PARAMETERS = 8

# torch dtypes as PyTorch's profiler writes them ("Input type"), which kforge already reads.
_TYPE_NAMES = {
    "torch.bfloat16": "c10::BFloat16",
    "torch.float16": "c10::Half",
    "torch.float32": "float",
    "torch.float64": "double",
    "torch.int64": "long int",
    "torch.int32": "int",
    "torch.bool": "bool",
}


def _tensors(value, tensor_type, out):
    """Appends the tensors in value (a tensor, or lists and tuples of them) to out."""
    if isinstance(value, tensor_type):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _tensors(item, tensor_type, out)


def _list_text(items):
    return "[" + ", ".join(items) + "]"


def _range_text(torch, module, name, args, kwargs):
    tensors = []
    _tensors(args, torch.Tensor, tensors)
    _tensors(list(kwargs.values()), torch.Tensor, tensors)
    parameters = []
    for p in module.parameters():
        parameters.append(p)
        if len(parameters) > MAX_PARAMETERS:
            parameters = []
            break
    operands = tensors + parameters
    sizes = _list_text(_list_text(str(int(d)) for d in t.shape) for t in operands)
    types = _list_text(_TYPE_NAMES.get(str(t.dtype), str(t.dtype)) for t in operands)
    head = f"module::{type(module).__name__}"
    if name:
        head += f", name = {name}"
    causal = getattr(module, "is_causal", None)
    if isinstance(causal, bool):
        head += f", is_causal = {int(causal)}"
    return f"{head}, sizes = {sizes}, types = {types}"


def _install(torch):
    import weakref

    names = weakref.WeakKeyDictionary()  # module -> its path from the outermost module called
    state = {"nvtx_ops": False}

    def name_of(module):
        name = names.get(module)
        if name is None:
            # The first call of a module not seen yet: it is an outermost one; name its tree.
            for sub_name, sub in module.named_modules():
                names.setdefault(sub, sub_name)
            name = names.get(module, "")
        return name

    def start_op_ranges():
        if state["nvtx_ops"] or not torch.cuda.is_initialized():
            return
        state["nvtx_ops"] = True
        try:
            torch.autograd.profiler.emit_nvtx(record_shapes=True).__enter__()
        except RuntimeError as e:  # the program runs a profiler of its own
            print(f"kforge: no op ranges: {e}", file=sys.stderr)

    try:  # a build of PyTorch without CUDA has no NVTX
        torch.cuda.nvtx.range_push("kforge")
        torch.cuda.nvtx.range_pop()
    except Exception as e:
        print(f"kforge: no module ranges: NVTX is not available ({e!r})", file=sys.stderr)
        return

    original_call = torch.nn.Module.__call__

    def call(module, *args, **kwargs):
        if torch.compiler.is_compiling():
            return original_call(module, *args, **kwargs)
        start_op_ranges()
        torch.cuda.nvtx.range_push(_range_text(torch, module, name_of(module), args, kwargs))
        try:
            return original_call(module, *args, **kwargs)
        finally:
            torch.cuda.nvtx.range_pop()

    torch.nn.Module.__call__ = call


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Runs _install once torch has finished importing, whoever imports it."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            try:
                _install(module)
            except Exception as e:  # never break the user's program
                print(f"kforge: PyTorch hooks not installed: {e!r}", file=sys.stderr)

        spec.loader.exec_module = exec_module
        return spec


def _import_shadowed_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    saved_path = sys.path[:]
    ours = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved_path
        if ours is not None:
            sys.modules["sitecustomize"] = ours


if os.environ.get("KFORGE_TORCH_HOOKS") == "1":
    if "torch" in sys.modules:
        _install(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _AfterTorchImport())
_import_shadowed_sitecustomize()
