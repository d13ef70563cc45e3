// Import of a torch.profiler Chrome trace (`prof.export_chrome_trace(path)`) into a Profile.
//
// The trace holds both sides of a run: CPU events (cat "cpu_op" for ATen ops with their
// "Input Dims" and "Input type", "user_annotation" for record_function ranges) and GPU
// activity (cat "kernel", "gpu_memcpy", "gpu_memset"), linked through the CUDA runtime or
// driver call that launched each GPU activity ("cuda_runtime" / "cuda_driver" events carry the
// same "correlation" id as the kernel).
//
// Every kernel becomes one row, once. Its context is the list of cpu_op and user_annotation
// events that enclose its launch call on the launching thread, outermost first. CPU ops are
// context only, never rows of their own, so no time is counted twice. Times are converted
// from the trace's microseconds to nanoseconds.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "profile/profile.h"

namespace kforge {

struct TorchTraceImport {
  Profile profile;
  // How each kernel found its launch: by correlation id (runtime/driver event, or the
  // trace's "ac2g" flow), by "External id" alone (no launch event in the trace), or not at all
  // (a kernel whose launch is outside the trace: it is kept, with an empty context).
  int64_t linked_by_correlation = 0;
  int64_t linked_by_external_id = 0;
  int64_t unlinked = 0;
  int64_t cpu_ops = 0;           // cpu_op events read (context only)
  int64_t user_annotations = 0;  // user_annotation events read (context and ranges)
};

// Converts a parsed trace: an object with "traceEvents" (and optionally "deviceProperties"),
// or a bare array of events. Throws UsageError when it is not a Chrome trace.
TorchTraceImport import_torch_trace(const nlohmann::json& trace);

// Reads and converts a trace file; the Profile's metadata names the file. Throws UsageError
// for a missing, compressed or malformed file.
TorchTraceImport read_torch_trace(const std::filesystem::path& path);

}  // namespace kforge
