"""Patches the models of an unmodified Python program with kforge ops (`kforge patch`).

`kforge patch --export DIR -- python3 train.py ...` runs the program with this directory on
PYTHONPATH, so Python imports this file at start-up. In the program's first Python process (not
in the processes it starts: torch.compile's workers, data loaders) it imports kforge_ops from the
export and registers a global forward pre-hook: the first module a forward is called on (the
model; a module's forward starts before its children's) is patched with kforge_ops.patch, its
report printed to stderr, and its submodules marked so that each later call costs one dict
lookup. At exit the calls per op ("kforge", or why they fell back) are printed.

KFORGE_PATCH_OPS=rmsnorm,cross_entropy limits the swaps (e.g. to those `kforge verify` found
faster in a compiled model). Nothing here fails the program: if PyTorch or the export cannot be
loaded, it says so and runs the program unpatched. A sitecustomize this one shadows is run too.
"""
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _run_shadowed_sitecustomize():
    path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _say(message):
    print(f"kforge patch: {message}", file=sys.stderr, flush=True)


def _install():
    # Only the program's first Python process: the variable is inherited by the rest.
    if os.environ.get("KFORGE_PATCH_CLAIMED"):
        return
    os.environ["KFORGE_PATCH_CLAIMED"] = str(os.getpid())
    try:
        import torch

        import kforge_ops
    except Exception as error:  # noqa: BLE001  (any failure leaves the program unpatched)
        _say(f"not patching: cannot load PyTorch or the export ({error})")
        return
    ops = [op for op in os.environ.get("KFORGE_PATCH_OPS", "").split(",") if op] or None
    seen_key = "_kforge_seen"

    def patch_first_forward(module, args):
        if module.__dict__.get(seen_key) or torch.compiler.is_compiling():
            return
        for sub in module.modules():
            sub.__dict__[seen_key] = True
        try:
            report = kforge_ops.patch(module, verbose=False, ops=ops)
        except Exception as error:  # noqa: BLE001
            _say(f"{type(module).__name__} left unpatched: {error}")
            return
        if report.swapped:
            print(report, file=sys.stderr, flush=True)

    torch.nn.modules.module.register_module_forward_pre_hook(patch_first_forward)

    import atexit

    @atexit.register
    def print_calls():
        calls = kforge_ops.stats()
        if calls:
            for op, counts in sorted(calls.items()):
                _say(f"calls {op}: " + ", ".join(f"{why} {n}" for why, n in sorted(counts.items())))


_install()
_run_shadowed_sitecustomize()
