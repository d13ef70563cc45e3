// The one timing path. `kforge bench`, the tuner and the experiment loop all time a kernel
// through measure(), so every integrity rule (docs/integrity.md) is written once and no caller
// can skip one:
//
//   1. all the work of a call is timed, or the call is refused: on CUDA the call is captured
//      into a graph and replayed; work it puts outside the given stream is INVALID;
//   2. every timed sample computes from inputs redrawn on the device from a seed nobody can
//      predict, into poisoned outputs; a sample that leaves outputs unwritten is WRONG;
//      probes among the samples (repeated inputs, a changed row) expose reused work; the
//      fastest, the median, the trap and random samples are taken again after the fact and
//      their outputs checked against the reference;
//   3. a time beyond the device's measured ceilings is INVALID, with the arithmetic shown.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/statistics.h"
#include "check/checker.h"
#include "device/ceilings.h"
#include "run/protocol.h"
#include "run/verdict.h"
#include "run/worker_client.h"

namespace kforge {

// The version of this timing path's rules. Results recorded under another (the tuner's
// database) are not trusted: a live tune evaluates those variants again. 2: the flush reaches
// L2 lines kept by an evict_last policy or marked persisting, and a call that changes the
// persisting set-aside or leaves an access policy window on the stream is refused.
inline constexpr const char* kMeasurementMethod = "integrity-2";

// What is timed: a compiled module, or the op's library call (cuBLAS; see cublas_ops.h).
struct TimedTarget {
  std::filesystem::path module;
  bool library = false;
};

struct MeasureOptions {
  BenchSettings settings;
  // Check timed samples against the reference after the fact: the fastest, the median and the
  // trap always, plus this many others drawn at random. Off only for kforge's own baselines.
  bool verify = true;
  int random_checks = 1;
  // Probes among the samples: repeats of the previous sample's inputs, and traps that change
  // one row of them.
  int repeats = 3;
  int traps = 1;
  std::chrono::milliseconds timeout{0};  // 0: scaled to the problem
};

// A candidate whose every repeat of the previous inputs takes under this fraction of its
// fastest fresh sample is reusing work across calls.
inline constexpr double kReuseRatio = 0.6;

struct Measurement {
  Verdict verdict = Verdict::ok;
  std::string detail;
  SampleStats stats;  // milliseconds; plain timed samples that were not throttled
  size_t throttled_samples = 0;
  size_t warmup_runs = 0;
  bool clock_monitored = false;
  int sm_clock_mhz = 0;
  std::string stop_reason;
  // The integrity record: samples, probes and which samples were checked, and how.
  size_t samples_taken = 0;         // timed samples and probes (not the warm-up)
  size_t probes = 0;                // repeats and traps among them
  SampleStats repeat_stats;         // repeats of the previous sample's inputs
  std::vector<std::string> checks;  // "sample 17 (fastest): matches the reference", ...
  std::string output;               // what the worker printed meanwhile (truncated)
  std::string library;              // the library call timed, for a library target
  bool timed() const { return verdict == Verdict::ok && stats.count > 0; }
  nlohmann::json to_json() const;
};

// Times `target` at one problem on `worker`. `tensors` (optional) holds inputs for the first,
// untimed call; kforge keeps them between measurements of one problem (the tuner) to save
// drawing them again. `ceilings` (optional) enables the physical limit check. References come
// from `checker` (on the host, or on the GPU in a worker that never runs candidate code).
Measurement measure(Checker& checker, WorkerClient& worker, const OpSpec& op, const Sizes& sizes,
                    DType dtype, const TimedTarget& target, const Ceilings* ceilings,
                    const MeasureOptions& options, CaseTensors* tensors = nullptr);

}  // namespace kforge
