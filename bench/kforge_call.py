"""Calling a kforge kernel module from Python, and timing it beside PyTorch by one method.

The kernel ABI (include/kforge/kernel.h) mirrored with ctypes, and the timer every Python-side
comparison uses: bench/peers, and the KernelBench scoring (src/kernelbench/kernelbench_problem.py).
"""
import ctypes
import math
import statistics
import time

KF_MAX_DIMS = 6
KF_DTYPES = {"f16": 0, "bf16": 1, "f32": 2, "f64": 3, "i32": 4, "i64": 5}


class KfTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * KF_MAX_DIMS), ("stride", ctypes.c_int64 * KF_MAX_DIMS)]


class KfArgs(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_int32), ("num_inputs", ctypes.c_int32),
                ("inputs", ctypes.POINTER(KfTensor)), ("num_outputs", ctypes.c_int32),
                ("outputs", ctypes.POINTER(KfTensor)), ("num_scalars", ctypes.c_int32),
                ("scalars", ctypes.POINTER(ctypes.c_double)), ("stream", ctypes.c_void_p)]


def kf_tensor(t, dtype_name):
    assert t.is_contiguous()
    k = KfTensor()
    k.data = t.data_ptr()
    k.dtype = KF_DTYPES[dtype_name]
    k.ndim = t.dim()
    for i in range(t.dim()):
        k.shape[i] = t.shape[i]
        k.stride[i] = t.stride(i)
    return k


def bind_entry(module_path, entry, inputs, outputs, dtype_names, stream, scalars=(),
               abi_version=1, what="the kernel"):
    """A no-argument callable that runs the module's entry point on these tensors (each with
    its kforge dtype name, inputs then outputs); the ABI structures live as long as it does."""
    fn = getattr(ctypes.CDLL(str(module_path)), entry)
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.POINTER(KfArgs)]
    ins = (KfTensor * len(inputs))(*[kf_tensor(t, d) for t, d in zip(inputs, dtype_names)])
    outs = (KfTensor * len(outputs))(
        *[kf_tensor(t, d) for t, d in zip(outputs, dtype_names[len(inputs):])])
    values = (ctypes.c_double * max(1, len(scalars)))(*scalars)
    args = KfArgs(abi_version, len(inputs), ins, len(outputs), outs, len(scalars), values,
                  ctypes.c_void_p(stream))

    def launch():
        status = fn(ctypes.byref(args))
        if status != 0:
            raise RuntimeError(f"kforge_run returned {status} for {what}")
    launch.keep = (ins, outs, values, args, inputs, outputs)
    return launch


class L2Demoter:
    """Lowers every L2 line of some tensors to normal eviction priority, and resets the lines an
    access policy window marked persisting. A kernel may load with an evict_last policy, or mark
    its inputs persisting in the L2 a device sets aside for that; either kind of line outlasts
    any amount of normal writes, so a flush of twice the L2 leaves it in place and the next
    sample reads it from L2. Demoted and reset first, they go like any other line, as in kforge's
    own timer (src/device/cuda_backend.cpp); here the demotion is a Triton kernel (Triton comes
    with PyTorch for CUDA) and the reset the driver's. Weaker than kforge's worker: a module
    timed in this process runs its host code in every sample and could patch this class itself,
    so this timer is for comparisons with PyTorch, not a defense against an adversarial file."""

    LINE = 128
    BLOCK = 1024
    CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06

    CUDA_ERROR_UNSUPPORTED_LIMIT = 215
    CUDA_ERROR_NOT_SUPPORTED = 801

    def __init__(self):
        self.driver = ctypes.CDLL("libcuda.so.1")
        self.driver.cuCtxGetLimit.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
        self.driver.cuCtxGetLimit.restype = ctypes.c_int
        self.driver.cuCtxResetPersistingL2Cache.argtypes = []
        self.driver.cuCtxResetPersistingL2Cache.restype = ctypes.c_int
        self.persisting_at_start = self._persisting_limit()
        import triton
        import triton.language as tl

        @triton.jit
        def demote_lines(first_line, n_lines, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            address = first_line + tl.minimum(i, n_lines - 1).to(tl.int64) * 128
            # A line that is not in L2 is left alone: nothing is fetched.
            tl.inline_asm_elementwise(
                "applypriority.global.L2::evict_normal [$1], 128;\n\tmov.u32 $0, 0;",
                "=r,l", [address], dtype=tl.int32, is_pure=False, pack=1)

        self.triton = triton
        self.kernel = demote_lines

    def _persisting_limit(self):
        value = ctypes.c_size_t(0)
        status = self.driver.cuCtxGetLimit(ctypes.byref(value),
                                           self.CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
        if status == self.CUDA_ERROR_UNSUPPORTED_LIMIT:
            return 0  # no set-aside on this device, so no persisting lines
        if status != 0:
            raise RuntimeError(f"cuCtxGetLimit(persisting L2) failed ({status})")
        return value.value

    def __call__(self, tensors):
        # The device's own set-aside stays; a call that changed it is not timed.
        limit = self._persisting_limit()
        if limit != self.persisting_at_start:
            raise RuntimeError(f"the L2 set aside for persisting accesses changed from "
                               f"{self.persisting_at_start} to {limit} bytes: lines kept there "
                               f"outlast the flush, so no sample would start cold")
        # Always: a call's host code runs in every sample here (there is no graph), so it could
        # raise the set-aside, mark lines and restore it before returning.
        status = self.driver.cuCtxResetPersistingL2Cache()
        if status not in (0, self.CUDA_ERROR_UNSUPPORTED_LIMIT, self.CUDA_ERROR_NOT_SUPPORTED):
            raise RuntimeError(f"cuCtxResetPersistingL2Cache failed ({status})")
        for t in tensors:
            if not t.is_cuda:
                continue
            storage = t.untyped_storage()  # all of it: a view may span more than numel elements
            base, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0:
                continue
            first = base & ~(self.LINE - 1)
            n_lines = (base + nbytes - first + self.LINE - 1) // self.LINE
            self.kernel[(self.triton.cdiv(n_lines, self.BLOCK),)](first, n_lines,
                                                                   BLOCK=self.BLOCK)


class Timer:
    """Median of event-timed single calls, each after the L2 cache was flushed by writing a
    buffer twice its size. Samples until the median's standard error is under `target_stderr`
    (relative) or `max_seconds` of sampling, with at least `min_samples`. With `redraw`, every
    call runs on fresh values: redraw() refills the inputs before the flush, outside the timed
    region. The L2 lines of `cold_tensors` (the calls' inputs and outputs; set them per problem)
    are demoted to normal priority before each flush, so that no eviction policy keeps them."""

    def __init__(self, torch, l2_bytes, min_samples=20, max_samples=2000, max_seconds=1.0,
                 target_stderr=0.002, redraw=None, flush="dirty", min_spin_us=100.0):
        self.torch = torch
        self.flush_buffer = torch.empty(2 * l2_bytes, dtype=torch.uint8, device="cuda")
        self.demote = L2Demoter()  # after the allocation: its driver calls need the context
        self.cold_tensors = []
        # "dirty": the buffer is written, so the call meets an L2 full of lines that must go back
        # to memory before its own take their place (as after a kernel that wrote a lot);
        # "clean": the buffer is read, so the lines it leaves can be dropped.
        if flush not in ("dirty", "clean"):
            raise ValueError(f"flush must be dirty or clean, not {flush!r}")
        self.flush_kind = flush
        self.flush_sink = torch.empty((), dtype=torch.int32, device="cuda")
        self.min_samples, self.max_samples = min_samples, max_samples
        self.max_seconds, self.target_stderr = max_seconds, target_stderr
        self.redraw = redraw
        # The spin before every call lasts at least min_spin_us, and at least `host_margin` times
        # the call's own host time (guards, wrappers, launches: over 100 us for some
        # torch.compile calls), so that the GPU is still spinning when its first kernel is queued.
        if min_spin_us < 10.0:
            raise ValueError("min_spin_us under 10 us: the spins that open (at least this long) "
                             "and close (~0.5 us) a call in kernel_us would no longer tell apart")
        self.min_spin_us = min_spin_us
        self.spin_cycles_per_us = self._spin_rate()
        self.spin_us = self.min_spin_us  # set per function by _warm_up

    host_margin = 3.0

    def _spin_rate(self):
        """The spin kernel's cycles per microsecond on this GPU, measured (its clock is not the
        nominal one, and moves with load)."""
        torch = self.torch
        cycles = 2_000_000
        torch.cuda._sleep(cycles)  # warm
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) * 1e3)

    def flush(self):
        """Evicts the L2 cache's contents by touching a buffer twice its size."""
        if self.flush_kind == "dirty":
            self.flush_buffer.zero_()
        else:
            self.torch.amax(self.flush_buffer.view(self.torch.int32), dim=0, out=self.flush_sink)

    def _warm_up(self, fn):
        """Three calls, and the spin sized to fn's host time (the slowest of the last two)."""
        host_us = []
        for _ in range(3):
            self.torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            host_us.append((time.perf_counter() - t0) * 1e6)
        self.torch.cuda.synchronize()
        self.host_us = max(host_us[1:])
        self.spin_us = max(self.min_spin_us, self.host_margin * self.host_us)

    def cold(self):
        """The call's tensors out of L2: their lines demoted to normal priority (lines a kernel
        loaded evict_last outlast any flush otherwise), then the flush."""
        self.demote(self.cold_tensors)
        self.flush()

    def _before_call(self):
        """What precedes every timed call: fresh inputs (with `redraw`), cold(), and a spin that
        keeps the GPU busy while the host issues the call, so that the timed region holds
        GPU work only: without it, a call whose host side (Python wrapper, guards, launch)
        outlasts the flush leaves the GPU idle inside the region."""
        if self.redraw:
            self.redraw()
        self.cold()
        self.torch.cuda._sleep(int(self.spin_us * self.spin_cycles_per_us))

    def time_us(self, fn):
        torch = self.torch
        self._warm_up(fn)
        samples = []
        start_wall = time.perf_counter()
        while len(samples) < self.max_samples:
            self._before_call()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
            if len(samples) >= self.min_samples and len(samples) % 10 == 0:
                median = statistics.median(samples)
                # Standard error of the median ~ 1.2533 * sd / sqrt(n) for near-normal samples.
                stderr = 1.2533 * statistics.pstdev(samples) / math.sqrt(len(samples))
                if stderr <= self.target_stderr * median:
                    break
                if time.perf_counter() - start_wall > self.max_seconds:
                    break
        samples.sort()
        n = len(samples)
        median = statistics.median(samples)
        # The spread as kforge's SampleStats has it: 1.4826 x the median absolute deviation,
        # relative to the median, and the median's standard error from it.
        rel_noise = 1.4826 * statistics.median(abs(x - median) for x in samples) / median
        return {"median_us": median, "p10_us": samples[n // 10],
                "p90_us": samples[(9 * n) // 10], "samples": n, "rel_noise": rel_noise,
                "rel_stderr": 1.2533 * rel_noise / math.sqrt(n),
                "host_us": round(self.host_us, 1), "spin_us": round(self.spin_us, 1)}

    def kernel_us(self, fn, samples=40):
        """A second account of fn's GPU time, beside time_us's events: the activity records
        (CUPTI, through torch.profiler) of the kernels, memsets and copies fn issues, each call
        after the same flush and spin as time_us's samples. Medians over the calls of the sum
        of their durations (what the GPU spent in fn's own work) and of their span (the first
        one's start to the last one's end, gaps included). Events also count the GPU's time
        from the start event to the first kernel and from the last one to the end event; where
        the two accounts differ by more between two functions than their times do, the events'
        comparison is not the kernels'. The medians of `lead_us` (the opening spin's end to the
        first activity's start) and `trail_us` (the last activity's end to the start of the
        closing spin, the next kernel in the stream) say on which side of the kernels the
        difference lies, and whether a following kernel waits for it too. `kernels` names the
        kernels that ran."""
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile
        self._warm_up(fn)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(samples):
                self._before_call()  # its spin (min_spin_us or more) opens the call
                fn()
                torch.cuda._sleep(1000)  # closes it (under a microsecond)
            torch.cuda.synchronize()
        activities = sorted((e for e in prof.profiler.kineto_results.events()
                             if str(e.device_type()).endswith("CUDA")), key=lambda e: e.start_ns())
        # A call's activities lie between a long spin and the next short one; the spins are told
        # apart by their length, so a missing record cannot pair a flush with a call.
        # Each call: (opening spin, its activities, closing spin).
        calls, current, opening = [], None, None
        for e in activities:
            if "spin_kernel" in e.name():
                if e.duration_ns() > 3_000:  # the opening spin is at least 10 us, the closing ~0.5
                    current, opening = [], e
                elif current is not None:
                    calls.append((opening, current, e))
                    current = None
            elif current is not None:
                current.append(e)
        calls = [c for c in calls if c[1]]
        if not calls:
            return {"error": "no activity records between the spins"}
        sums = [sum(e.duration_ns() for e in c) / 1e3 for _, c, _ in calls]
        spans = [(max(e.end_ns() for e in c) - min(e.start_ns() for e in c)) / 1e3
                 for _, c, _ in calls]
        leads = [(min(e.start_ns() for e in c) - o.end_ns()) / 1e3 for o, c, _ in calls]
        trails = [(z.start_ns() - max(e.end_ns() for e in c)) / 1e3 for _, c, z in calls]
        # Each kernel's share: per name, the median over calls of its durations' sum in a call
        # (which of a multi-kernel call's kernels the time goes to).
        by_name = {}
        for _, c, _ in calls:
            in_call = {}
            for e in c:
                name = e.name()[:200]
                in_call[name] = in_call.get(name, 0.0) + e.duration_ns() / 1e3
            for name, us in in_call.items():
                by_name.setdefault(name, []).append(us)
        return {"sum_median_us": statistics.median(sums),
                "span_median_us": statistics.median(spans),
                "host_us": round(self.host_us, 1), "spin_us": round(self.spin_us, 1),
                "lead_us": statistics.median(leads), "trail_us": statistics.median(trails),
                "activities_per_call": statistics.median(len(c) for _, c, _ in calls),
                "calls": len(calls),
                # Which kernels ran: torch.compile's choice can differ between processes
                # (inductor's triton_per_* reduction keeps a row in registers, triton_red_* loops).
                "kernels": sorted(by_name),
                "kernel_median_us": {name: statistics.median(us) for name, us in sorted(by_name.items())}}
