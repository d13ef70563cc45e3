// From CUPTI raw files to a Profile: what `kforge profile` does after the command ended.
//
// Every CUDA process of the command writes one raw file, $KFORGE_PROFILE_DIR/raw-<pid>.json
// (libkforge_inject.so, src/profile/inject/), holding CUPTI's records as they came: nothing is
// paired or linked inside the profiled program. Its format, version 1 (times are nanoseconds on
// CUPTI's clock, which CPU and GPU records of one machine share):
//
//   {"format": "kforge-cupti-raw", "version": 1,
//    "pid": 4242,
//    "written_at": "exit",        // the exit path that wrote it last: "exit", "context-destroy",
//                                 // "signal N"
//    "dropped_records": 0,        // records CUPTI could not deliver (no buffer space)
//    "unknown_records": 0,        // records of kinds not kept
//    "errors": ["cuptiActivityEnable(...) failed: CUPTI_ERROR_..."],
//    "devices": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "compute_capability": [9, 0],
//                 "sm_count": 132}],
//    "kernel_names": ["_Z14rmsnorm_kernelPKfS0_Pfif", "triton_poi_fused_0"],
//    "kernels": [{"name": 0,       // index into kernel_names
//                 "grid": [512, 1, 1], "block": [256, 1, 1], "cluster": [0, 0, 0],
//                 "registers": 32, "static_smem": 1024, "dynamic_smem": 0,
//                 "start": 1000, "end": 2000, "device": 0, "stream": 7, "correlation": 12}],
//    "transfers": [{"kind": "HtoD",    // HtoD DtoH DtoD HtoH PtoP (HtoA ...) or memset
//                   "bytes": 4096, "start": 10, "end": 20, "device": 0, "stream": 7,
//                   "correlation": 9}],
//    "api_calls": [{"api": "runtime",  // or "driver" (Triton launches with cuLaunchKernel)
//                   "cbid": 211, "correlation": 12, "thread": 4243, "start": 900, "end": 950}],
//    "api_counts": [{"api": "runtime", "cbid": 211, "name": "cudaLaunchKernel_v7000",
//                    "calls": 1200}],   // every call recorded, launching or not
//    "markers": [{"id": 1, "kind": "start", "time": 800, "thread": 4243, "name": "step",
//                 "domain": "..."},      // domain: absent for NVTX's default domain
//                {"id": 1, "kind": "end", "time": 2500, "thread": 4243}]}
//
// api_calls holds only the calls whose correlation id some kernel or transfer carries (the calls
// that launched GPU work), api_counts every call by API (optional); markers are NVTX push/pop
// and start/end ranges ("start" and "end" with the same id) and marks ("instant", ignored
// here). Unknown fields are ignored.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "profile/profile.h"

namespace kforge {

struct AssembleOptions {
  std::vector<std::string> command;
  std::optional<int> exit_code;
  // Region: keep only kernels and transfers launched inside occurrences of the NVTX range
  // `range`, after skipping the first `skip` occurrences in each process. Empty: keep all.
  std::string range;
  int64_t skip = 0;
};

// The raw files (raw-*.json) in `directory`, ordered by name. Throws Error naming a file that
// is not JSON.
std::vector<nlohmann::json> read_raw_files(const std::filesystem::path& directory);

// One Profile from the raw files of all processes of a command: kernels demangled and linked to
// the call that launched them (by process and correlation id), each with the NVTX ranges open on
// the launching thread at launch time as its context (outermost first); NVTX ranges paired, with
// their nesting depth per thread; devices merged; dropped records summed. What could not be
// linked or timed, and the API calls recorded by name, are in metadata["cupti"].
// Throws Error for a file that is not a raw profile, UsageError when `options.range` never
// occurs or `options.skip` leaves none of its occurrences.
Profile assemble_profile(const std::vector<nlohmann::json>& raw_files,
                         const AssembleOptions& options);

// The readable form of a kernel name: C++ names demangled, others (nvjet_*, triton_*) as given.
std::string demangle_kernel_name(const std::string& name);

// A kernel name short enough for one table column: no return type, no parameter list, template
// arguments elided ("void f<128, float>(float*)" -> "f<…>"), at most `width` characters.
std::string short_kernel_name(const std::string& demangled, size_t width = 60);

}  // namespace kforge
