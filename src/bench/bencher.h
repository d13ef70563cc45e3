// `kforge bench`: one variant of a kernel file at one problem. Correctness at that problem
// first, then the one timing path (bench/measurement.h) with every integrity rule, then
// throughput against the device's measured ceilings, and the baseline timed the same way in a
// worker that never ran the candidate.
#pragma once

#include <chrono>
#include <cmath>
#include <optional>

#include <nlohmann/json.hpp>

#include "bench/measurement.h"
#include "bench/statistics.h"
#include "check/checker.h"
#include "device/ceilings.h"
#include "run/protocol.h"

namespace kforge {

// What the candidate is compared with, timed by the same method in the same run.
struct BaselineResult {
  std::string what;  // "cuBLAS ..." or the starter kernel's variant
  bool ok = false;
  std::string detail;  // why there is no timing, when !ok
  SampleStats stats;
  double speedup = 0;  // baseline median / candidate median
  Comparison comparison = Comparison::unclear;
};

struct BenchOptions {
  Sizes sizes;
  DType dtype = DType::bf16;
  ParamValues params;
  std::string arch;
  BenchSettings settings;
  uint64_t seed = 0;
  std::chrono::milliseconds timeout{0};
  bool baseline = true;  // also time the baseline
};

struct BenchResult {
  Verdict verdict = Verdict::ok;  // of the gate and the measurement; no timing unless ok
  std::string detail;
  Measurement measurement;  // the integrity record (samples, probes, checks, output)
  CompileResult build;
  Sizes sizes;
  DType dtype = DType::bf16;
  uint64_t seed = 0;
  SampleStats stats;  // milliseconds
  size_t throttled_samples = 0;
  bool clock_monitored = false;
  int sm_clock_mhz = 0;
  std::string stop_reason;
  Cost cost;
  double gbps = 0;
  double tflops = 0;
  double pct_of_copy = NAN;    // achieved bytes/s over the measured copy ceiling
  double pct_of_matmul = NAN;  // achieved FLOP/s over the measured matmul ceiling
  std::optional<BaselineResult> baseline;

  nlohmann::json to_json(const OpSpec& op) const;
};

BenchResult bench_kernel(Checker& checker, WorkerClient& worker, const KernelFile& file,
                         const OpSpec& op, const BenchOptions& options, const Ceilings& ceilings);

}  // namespace kforge
