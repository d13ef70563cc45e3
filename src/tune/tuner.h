// `kforge tune`: search a kernel file's space for the fastest correct variant at one problem.
//
// Pipeline: the strategy proposes points; each proposed variant is looked up in the results
// database and, when new, compiled on a pool of CPU threads while earlier variants run on the
// device, one at a time: resources judged (post_compile_rejection), a smoke run, a correctness
// gate at the tuned problem, then timing with a cold L2. Results come back to the strategy in
// proposal order, and every evaluation is committed to the database before the next starts.
// With several devices (a DevicePool of lanes) each lane evaluates the next compiled point as
// soon as it is free; results still reach the strategy in proposal order, so the search is the
// same on one lane or eight. Lanes' timings rank together only when a calibration run (one
// variant timed on every lane at once) shows that they agree; otherwise the best few are timed
// again on one lane and the winner is picked from those timings alone.
// The winner then passes all five stages of the checker (in the tuned dtype) before it is
// reported; a winner that fails is recorded and the next best is checked.
//
// Replay runs the same loop with the database as the only evaluator: no compiler, no device.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "check/checker.h"
#include "device/ceilings.h"
#include "ops/op_spec.h"
#include "pool/device_pool.h"
#include "run/protocol.h"
#include "tune/results_db.h"
#include "tune/space.h"

namespace kforge {

struct TuneProblem {
  const OpSpec* op = nullptr;
  Sizes sizes;
  DType dtype = DType::bf16;
  // "rmsnorm 8192x8192 bf16": the key evaluations are stored under.
  std::string key() const;
};

// Sampling for tuning: enough to rank variants (0.5% standard error of the median), not the
// 0.2% of `kforge bench`; a winner is re-timed by `kforge bench` for records.
BenchSettings tuning_bench_settings();

// A point to try first: a variant known to be good for this problem elsewhere (the same size's
// row in another device's table). Starts that name no file of the search, or a point that is
// not feasible here, are skipped and counted in the report.
struct TuneStart {
  std::string file;      // a kernel file's name, e.g. "rmsnorm_rowblock.cu"
  ParamValues tunables;  // the rest take the file's defaults
  std::string origin;    // where it came from, for the report
};

struct TuneOptions {
  std::string strategy = "local";
  std::vector<TuneStart> starts;
  uint64_t seed = 0;           // 0: derived from the problem and strategy (a re-run resumes)
  size_t max_evaluations = 0;  // 0: no limit
  double max_fraction = 0;     // > 0: at most this share of the feasible space (rounded up)
  double max_seconds = 0;      // wall-clock budget; 0: no limit
  size_t lookahead = 16;       // proposals in flight; part of a tune's identity for replay
  unsigned compile_jobs = 0;   // 0: one per CPU core
  std::string arch;            // empty: the device's default
  BenchSettings bench = tuning_bench_settings();
  bool final_check = true;  // five stages on the winner
  // Measured ceilings of the device: times beyond them are refused (bench/limits.h).
  const Ceilings* ceilings = nullptr;
  bool use_database = true;  // false: evaluate again even when recorded (results replaced)
};

struct TuneEvaluation {
  PointId point = 0;
  EvaluationRecord record;
  bool from_database = false;
};

struct TuneReport {
  TuneProblem problem;
  std::string device;
  std::string strategy;
  uint64_t seed = 0;
  bool replay = false;
  double raw_size = 0;
  uint64_t feasible = 0;          // exact, or estimated when estimate_samples > 0
  uint64_t estimate_samples = 0;  // raw points sampled per estimated file; 0: counts exact
  double solve_seconds = 0;
  std::map<std::string, double> pruned_before_compile;  // raw combinations, by reason
  bool counts_estimated() const { return estimate_samples > 0; }
  std::map<std::string, int> rejected_after_compile;  // variants, by reason
  std::map<std::string, int> failed;                  // variants, by "VERDICT at stage"
  std::vector<TuneEvaluation> evaluations;            // in proposal order
  std::optional<size_t> best;                         // index into evaluations
  std::optional<size_t> baseline;                     // the file's defaults, if evaluated
  std::vector<std::string> starts_used;               // origins of the starts proposed first
  std::vector<std::string> starts_skipped;  // origins of starts not feasible here, and why
  std::string stop_reason;
  // Compilation: variants compiled here (not from the cache or the database), the wall time
  // during which at least one compile ran, and the compilers' own time summed.
  size_t compiled = 0;
  unsigned compile_jobs = 0;
  double compile_busy_seconds = 0;
  double compile_seconds_sum = 0;
  double device_wait_seconds = 0;  // time the device sat waiting for a compile
  double wall_seconds = 0;
  std::string final_check;  // "PASS", "FAIL: ..." or "" when not run
  size_t missing_in_replay = 0;
  // Several devices: each lane's evaluations and whether it was lost; the calibration (lanes'
  // times of one variant and whether they agree); evaluations run again because their worker
  // ended; the evaluations timed again on one lane when the lanes disagreed.
  nlohmann::json lanes = nlohmann::json::array();
  nlohmann::json calibration;
  size_t retried = 0;
  size_t retimed = 0;

  // Variants per second while compiling (achieved: limited by how far ahead the device lets
  // compiles run), and what the pool could sustain: jobs / mean seconds per compile.
  double compile_throughput() const;
  double compile_capacity() const;
  double compile_seconds_per_variant() const;
  // Indices of the timed evaluations, fastest first.
  std::vector<size_t> ranked() const;
  size_t from_database_count() const;
  nlohmann::json to_json(size_t top) const;
};

struct TuneProgress {
  size_t evaluated = 0;
  size_t valid = 0;
  size_t budget = 0;  // 0: no evaluation budget
  std::optional<double> best_ms;
  const TuneEvaluation* last = nullptr;
};
using TuneProgressFn = std::function<void(const TuneProgress&)>;

// The device limits, element size and problem sizes that a kernel file's expressions may name.
Bindings tune_context(const DeviceInfo& device, const TuneProblem& problem);

class Tuner {
 public:
  // `compiler` and `devices` are used for live tunes; a replay needs only `db`.
  Tuner(ResultsDb& db, const Compiler* compiler, DevicePool* devices)
      : db_(db), compiler_(compiler), devices_(devices) {}

  TuneReport tune(const std::vector<const KernelFile*>& files, const TuneProblem& problem,
                  const TuneOptions& options, const TuneProgressFn& progress = {},
                  const std::function<void(const std::string&)>& say = {});

  // Replays `options.strategy` over the evaluations recorded for `problem` on `device` (a
  // device_key()). Points never recorded count as failures and are reported as missing.
  TuneReport replay(const std::vector<const KernelFile*>& files, const TuneProblem& problem,
                    const std::string& device, const TuneOptions& options,
                    const TuneProgressFn& progress = {});

 private:
  ResultsDb& db_;
  const Compiler* compiler_;
  DevicePool* devices_;
};

}  // namespace kforge
