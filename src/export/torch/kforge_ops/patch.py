"""Swap kforge ops into a model without editing its source.

patch(model) replaces, in place:
  - RMSNorm modules (Hugging Face's LlamaRMSNorm, Qwen2RMSNorm and the like: a class named
    ...RMSNorm with a 1-D weight and variance_epsilon or eps; torch.nn.RMSNorm) -> kforge::rmsnorm
  - torch.nn.LayerNorm over the last dim with weight and bias -> kforge::layernorm
  - Hugging Face's rotate-half RoPE (the function apply_rotary_pos_emb of the model's modeling
    module) -> kforge::rotary_embedding_half for q and k
  - rotate-half RoPE modules holding [max_seq, head_dim / 2] cos and sin tables (a class named
    ...RotaryEmbeddingHalf, as in python/examples/llama.py) -> kforge::rotary_embedding_half
  - torch.nn.CrossEntropyLoss (mean, ignore index -100, no weights or smoothing) on [rows,
    classes] logits -> kforge::cross_entropy
  - SwiGLU MLPs: Hugging Face's (LlamaMLP, Qwen2MLP, MistralMLP and the like: gate_proj,
    up_proj and down_proj without biases, act_fn SiLU) and python/examples/llama.py's SwiGLU
    (w_gate, w_up, w_down) -> kforge::fused_mlp
  - a Hugging Face causal LM's loss (ForCausalLMLoss: shift, flatten, mean cross-entropy) ->
    kforge::cross_entropy on the logits as the model made them (kforge accumulates in f32, so
    the upcast Hugging Face makes first is not needed)
and reports every swap and what it left alone, with the reason. Only ops the export carries are
swapped (`ops` narrows them further). Inside a torch.compile graph a kforge op is opaque to
inductor, which can no longer fuse it with its neighbours, so an op can be faster in eager and
slower in a compiled graph: `kforge verify` measures each and says which ops to swap into a model
that will be compiled (patch(model, ops=...)). A swapped module uses PyTorch's own forward while gradients are being recorded (kforge
ops have no backward), so run inference under torch.no_grad() or torch.inference_mode().
report.undo() restores the model.
"""
import inspect
import sys
from dataclasses import dataclass, field

import torch

from . import _C, exported_ops


@dataclass
class PatchReport:
    swapped: list = field(default_factory=list)  # (where, what, kforge op)
    not_swapped: list = field(default_factory=list)  # (where, what, reason)
    _undo: list = field(default_factory=list, repr=False)

    def undo(self):
        for restore in reversed(self._undo):
            restore()
        self._undo.clear()

    def __str__(self):
        lines = [f"kforge patch: {len(self.swapped)} swapped, {len(self.not_swapped)} left alone"]
        lines += [f"  swapped     {where}: {what} -> {op}" for where, what, op in self.swapped]
        lines += [f"  left alone  {where}: {what} ({why})" for where, what, why in self.not_swapped]
        return "\n".join(lines)


def _recording_grad(*tensors):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _kforge_call(op):
    """torch.ops.kforge.<op> where torch.compile traces it, else the extension's function itself
    (the same C++, reached without torch.ops' dispatch from Python: several microseconds a call
    less). Callers have already sent calls that record gradients to PyTorch's own ops."""
    traced = getattr(torch.ops.kforge, op).default
    direct = getattr(_C, op)

    def call(*args):
        return traced(*args) if torch.compiler.is_compiling() else direct(*args)

    return call


_rmsnorm = _kforge_call("rmsnorm")
_layernorm = _kforge_call("layernorm")
_cross_entropy = _kforge_call("cross_entropy")
_rotary_embedding_half = _kforge_call("rotary_embedding_half")
_fused_mlp = _kforge_call("fused_mlp")


def _rmsnorm_eps(module):
    for name in ("variance_epsilon", "eps"):
        eps = getattr(module, name, None)
        if isinstance(eps, float):
            return eps
    return None


def _swap_forward(report, module, where, op, forward):
    # The forward was an attribute of the class; removing the instance's restores it.
    module.forward = forward
    report.swapped.append((where, type(module).__name__, f"kforge::{op}"))
    report._undo.append(lambda: delattr(module, "forward"))


def _patch_rmsnorm(report, module, where):
    weight = getattr(module, "weight", None)
    eps = _rmsnorm_eps(module)
    if isinstance(module, torch.nn.RMSNorm) and eps is None:
        eps_of = lambda x: torch.finfo(x.dtype).eps  # noqa: E731  (nn.RMSNorm's default)
    elif eps is not None:
        eps_of = lambda x: eps  # noqa: E731
    else:
        report.not_swapped.append((where, type(module).__name__, "no eps attribute found"))
        return
    if weight is None or weight.dim() != 1:
        report.not_swapped.append((where, type(module).__name__, "no 1-D weight"))
        return
    original = module.forward

    def forward(hidden_states):
        if _recording_grad(hidden_states, module.weight):
            _C.count("rmsnorm", "autograd: gradients are being recorded")
            return original(hidden_states)
        return _rmsnorm(hidden_states, module.weight, eps_of(hidden_states))

    _swap_forward(report, module, where, "rmsnorm", forward)


def _patch_layernorm(report, module, where):
    if len(module.normalized_shape) != 1 or module.weight is None or module.bias is None:
        report.not_swapped.append((where, "LayerNorm", "not over the last dim with weight and bias"))
        return
    original = module.forward

    def forward(x):
        if _recording_grad(x, module.weight, module.bias):
            _C.count("layernorm", "autograd: gradients are being recorded")
            return original(x)
        return _layernorm(x, module.weight, module.bias, module.eps)

    _swap_forward(report, module, where, "layernorm", forward)


def _patch_cross_entropy(report, module, where):
    plain = (module.weight is None and module.ignore_index == -100 and module.reduction == "mean"
             and module.label_smoothing == 0.0)
    if not plain:
        report.not_swapped.append((where, "CrossEntropyLoss",
                                   "weights, label smoothing, another ignore index or reduction"))
        return
    original = module.forward

    def forward(logits, targets):
        if logits.dim() != 2 or targets.dim() != 1 or _recording_grad(logits):
            _C.count("cross_entropy", "call: not [rows, classes] logits with class-index targets")
            return original(logits, targets)
        return _cross_entropy(logits, targets)

    _swap_forward(report, module, where, "cross_entropy", forward)


def _is_silu(act):
    return isinstance(act, torch.nn.SiLU) or act is torch.nn.functional.silu or \
        type(act).__name__ in ("SiLU", "SiLUActivation")


# The projections' names: Hugging Face's, then python/examples/llama.py's.
_MLP_PROJECTIONS = (("gate_proj", "up_proj", "down_proj"), ("w_gate", "w_up", "w_down"))


def _mlp_projections(module):
    """(gate, up, down) nn.Linear modules of a SwiGLU MLP, or None."""
    for names in _MLP_PROJECTIONS:
        found = [getattr(module, n, None) for n in names]
        if all(isinstance(p, torch.nn.Linear) for p in found):
            return found
    return None


def _patch_mlp(report, module, where):
    name = type(module).__name__
    gate, up, down = _mlp_projections(module)
    act = getattr(module, "act_fn", None)
    # Without an act_fn attribute the activation is in the forward's code: trusted only for the
    # example's own class, whose forward is known to be silu.
    if not (_is_silu(act) or (act is None and name == "SwiGLU")):
        report.not_swapped.append((where, name, f"activation {type(act).__name__} is not SiLU"))
        return
    if any(p.bias is not None for p in (gate, up, down)):
        report.not_swapped.append((where, name, "projections with biases"))
        return
    hidden, dim = gate.weight.shape
    if up.weight.shape != (hidden, dim) or down.weight.shape != (dim, hidden):
        report.not_swapped.append((where, name, "gate, up and down shapes do not chain"))
        return
    original = module.forward

    def forward(x):
        if _recording_grad(x, gate.weight, up.weight, down.weight):
            _C.count("fused_mlp", "autograd: gradients are being recorded")
            return original(x)
        return _fused_mlp(x, gate.weight, up.weight, down.weight)

    _swap_forward(report, module, where, "fused_mlp", forward)


def _patch_rotary_tables(report, module, where):
    """A module holding cos and sin tables [max_seq, head_dim / 2] that rotates one [batch,
    heads, seq, head_dim] tensor per call, rotate-half (python/examples/llama.py's)."""
    cos, sin = getattr(module, "cos", None), getattr(module, "sin", None)
    if not (torch.is_tensor(cos) and torch.is_tensor(sin) and cos.dim() == 2 and sin.dim() == 2):
        report.not_swapped.append((where, type(module).__name__, "no [max_seq, head_dim / 2] cos and sin tables"))
        return
    original = module.forward

    def forward(x):
        if x.dim() != 4 or x.shape[-1] != 2 * module.cos.shape[1] or _recording_grad(x):
            _C.count("rotary_embedding_half", "call: not a [batch, heads, seq, head_dim] tensor")
            return original(x)
        s = x.shape[2]
        c = module.cos[:s].to(x.dtype).contiguous()
        t = module.sin[:s].to(x.dtype).contiguous()
        # x is usually a transposed view of a projection; the kernel takes it packed.
        return _rotary_embedding_half(x.contiguous(), c, t)

    _swap_forward(report, module, where, "rotary_embedding_half", forward)


def _rope_replacement(original):
    # The function's extra parameters differ between transformers versions (position_ids was
    # dropped), so unsqueeze_dim is found by name.
    signature = inspect.signature(original)
    # Every layer of a step gets the same cos and sin tensors: in eager, their packed first
    # halves are made once per step. The cache holds the tensors themselves (so their memory
    # cannot be reused by new tables while cached) and their version counters, which see
    # in-place edits (inference tensors have none: an in-place edit of the tables between the
    # layers of one step, which Hugging Face never makes, would go unseen there).
    last = {"tables": None, "versions": None, "halves": None}

    def version(t):
        return None if t.is_inference() else t._version

    def halves(cos, sin):
        half = cos.shape[-1] // 2
        if torch.compiler.is_compiling():
            return cos[0, :, :half].contiguous(), sin[0, :, :half].contiguous()
        tables = last["tables"]
        if tables is None or tables[0] is not cos or tables[1] is not sin or \
                last["versions"] != (version(cos), version(sin)):
            last["tables"] = (cos, sin)
            last["versions"] = (version(cos), version(sin))
            last["halves"] = (cos[0, :, :half].contiguous(), sin[0, :, :half].contiguous())
        return last["halves"]

    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        unsqueeze_dim = 1
        if args or kwargs:
            bound = signature.bind(q, k, cos, sin, *args, **kwargs)
            unsqueeze_dim = bound.arguments.get("unsqueeze_dim", 1)
        # Hugging Face's cos and sin are [batch, seq, head_dim] with the halves repeated; the
        # kforge op takes one position table, [seq, head_dim / 2], shared by the batch.
        shared = cos.dim() == 3 and cos.shape[0] == 1 and cos.shape[-1] == q.shape[-1]
        if unsqueeze_dim != 1 or not shared or q.dim() != 4 or _recording_grad(q, k):
            _C.count("rotary_embedding_half", "call: not the shared-position, head-first form")
            return original(q, k, cos, sin, *args, **kwargs)
        c, s = halves(cos, sin)
        # q and k arrive as transposed views of the projections ([batch, seq, heads, head_dim]
        # in memory); the kernel takes [batch, heads, seq, head_dim] packed, so they are copied
        # (one pass each; the composite they replace makes several).
        return (_rotary_embedding_half(q.contiguous(), c, s),
                _rotary_embedding_half(k.contiguous(), c, s))

    return apply_rotary_pos_emb


def _causal_lm_loss_replacement(original):
    """Hugging Face's ForCausalLMLoss (transformers.loss.loss_utils) on kforge's cross-entropy:
    the plain case (mean over tokens, ignore index -100, no num_items_in_batch) only."""

    def loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100,
             shift_labels=None, **kwargs):
        if num_items_in_batch is not None or ignore_index != -100 or kwargs or _recording_grad(logits):
            _C.count("cross_entropy", "call: loss with num_items_in_batch, another ignore index or gradients")
            return original(logits, labels, vocab_size, num_items_in_batch, ignore_index,
                            shift_labels, **kwargs)
        if shift_labels is None:
            labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:]
        rows = logits.reshape(-1, vocab_size)
        targets = shift_labels.reshape(-1).to(device=rows.device, dtype=torch.int64).contiguous()
        # Hugging Face returns the loss in f32 (it upcasts the logits first).
        return _cross_entropy(rows.contiguous(), targets).float()

    return loss


# The modules patch() swaps: (does this module match, given it and its class name; the kforge
# op; the function that swaps it).
_MODULE_SWAPS = [
    (lambda m, name: name.endswith("RMSNorm") or isinstance(m, torch.nn.RMSNorm), "rmsnorm",
     _patch_rmsnorm),
    (lambda m, name: isinstance(m, torch.nn.LayerNorm), "layernorm", _patch_layernorm),
    (lambda m, name: isinstance(m, torch.nn.CrossEntropyLoss), "cross_entropy",
     _patch_cross_entropy),
    (lambda m, name: name.endswith("RotaryEmbeddingHalf"), "rotary_embedding_half",
     _patch_rotary_tables),
    (lambda m, name: _mlp_projections(m) is not None, "fused_mlp", _patch_mlp),
]


def patch(model, verbose=True, ops=None):
    """Swaps kforge ops into `model` in place; returns a PatchReport (str() it, or .undo()).

    ops: the kforge ops to swap in (default: every op the export carries).
    """
    exported = set(exported_ops())
    if ops is not None:
        unknown = set(ops) - exported
        if unknown:
            raise ValueError(f"not in this export: {', '.join(sorted(unknown))} (it has {', '.join(sorted(exported))})")
        exported = set(ops)
    report = PatchReport()
    modeling_modules = set()

    def left_alone(where, name, op):
        report.not_swapped.append((where, name, f"{op} not in this export" if ops is None else f"{op} not asked for"))

    for where, module in model.named_modules():
        where = where or "(model)"
        name = type(module).__name__
        modeling_modules.add(type(module).__module__)
        swap = next((s for s in _MODULE_SWAPS if s[0](module, name)), None)
        if swap is not None:
            _, op, patcher = swap
            if op in exported:
                patcher(report, module, where)
            else:
                left_alone(where, name, op)
        elif name.endswith("MLP") or name == "SwiGLU":
            report.not_swapped.append((where, name, "not a gate/up/down SwiGLU of nn.Linear projections"))
        elif name.endswith("Attention"):
            report.not_swapped.append((where, name, "attention runs PyTorch's SDPA; kforge's attention is not exported"))

    # A Hugging Face causal LM's loss: set on the instance (the property's setter), so only this
    # model changes.
    loss_function = getattr(model, "loss_function", None) if hasattr(type(model), "loss_function") else None
    if getattr(loss_function, "__name__", "") == "ForCausalLMLoss":
        if "cross_entropy" in exported:
            had_own = "_loss_function" in vars(model)
            model.loss_function = _causal_lm_loss_replacement(loss_function)
            report.swapped.append(("(model).loss_function", "ForCausalLMLoss", "kforge::cross_entropy"))
            report._undo.append(lambda: setattr(model, "loss_function", loss_function) if had_own
                                else delattr(model, "_loss_function"))
        else:
            left_alone("(model).loss_function", "ForCausalLMLoss", "cross_entropy")

    for module_name in sorted(modeling_modules):
        module = sys.modules.get(module_name)
        original = getattr(module, "apply_rotary_pos_emb", None) if module else None
        if original is None:
            continue
        if "rotary_embedding_half" not in exported:
            left_alone(module_name, "apply_rotary_pos_emb", "rotary_embedding_half")
            continue
        setattr(module, "apply_rotary_pos_emb", _rope_replacement(original))
        report.swapped.append((module_name, "apply_rotary_pos_emb", "kforge::rotary_embedding_half"))
        report._undo.append(lambda m=module, f=original: setattr(m, "apply_rotary_pos_emb", f))
    if verbose:
        print(report)
    return report
