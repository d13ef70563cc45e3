// The five-stage correctness check of a kernel file. A variant that fails a stage is never
// timed as a result.
//
//   1. smoke          one small problem per dtype
//   2. shape_sweep    the op's test sizes x dtypes
//   3. stability      adversarial inputs (near max, near zero, mixed scales, zeros, equal, ...)
//                     at 10x tolerance
//   4. determinism    bitwise-equal outputs over repeated runs and from a second worker process,
//                     then a few inputs changed: a kernel that returns results it kept from
//                     an earlier call fails here
//   5. edge_cases     the op's edge sizes (one row, one column, odd and prime widths) x dtypes
//
// Inputs are drawn fresh from a seed recorded in the report; outputs are NaN-poisoned before
// every run; tensors carry guard bands, and inputs must come back unchanged.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "check/compare.h"
#include "compile/compiler.h"
#include "compile/kernel_file.h"
#include "ops/op_spec.h"
#include "run/case_tensors.h"
#include "run/verdict.h"
#include "run/worker_client.h"

namespace kforge {

struct CheckOptions {
  uint64_t seed = 0;                     // 0: draw one
  std::vector<DType> dtypes;             // empty: every dtype both the file and the op support
  ParamValues params;                    // overrides of the file's defaults
  std::string arch;                      // empty: the device's default
  int64_t max_elements = 0;              // skip problems with a larger tensor (0: no limit)
  std::chrono::milliseconds timeout{0};  // per run; 0: scaled to the problem size
  std::vector<std::string> stages;       // empty: all five
  // compute-sanitizer tools to run after the five stages (a sixth stage, "sanitize"), on small
  // problems; empty: none. CUDA kernel files only.
  std::vector<std::string> sanitizer_tools;
};

struct CaseResult {
  std::string stage;
  std::string label;
  Sizes sizes;
  DType dtype = DType::f32;
  InputKind kind = InputKind::normal;
  uint64_t seed = 0;
  Verdict verdict = Verdict::ok;
  std::string detail;
  CompareResult compare;
  bool skipped = false;
  std::string output;  // what the kernel printed during the run (truncated)
};

struct StageReport {
  std::string name;
  bool passed = true;
  bool ran = false;
  int cases = 0;
  int skipped = 0;
  double worst_abs_error = 0;
  double worst_rel_error = 0;
  std::vector<CaseResult> results;
};

struct CheckReport {
  std::string file;
  std::string op;
  uint64_t seed = 0;
  Verdict verdict = Verdict::ok;  // the first failure's verdict, or ok
  std::string detail;             // the first failure, for people
  std::vector<CompileResult> builds;
  std::vector<StageReport> stages;
  std::string output;  // what the kernel printed, over all cases (truncated)
  bool passed() const { return verdict == Verdict::ok; }
  nlohmann::json to_json(const OpSpec& op) const;
};

// Progress lines ("[shape_sweep] large bf16 ... OK").
using ProgressFn = std::function<void(const std::string&)>;

// Problems whose float64 host reference would take more than this many FLOPs are checked
// against the op's GPU reference instead (on the CUDA backend), or skipped (on the CPU backend).
inline constexpr double kHostReferenceFlopLimit = 4e9;

// Whether `backend` ("cpu", "cuda") has a reference for `op` at `sizes`: the host's in float64
// up to kHostReferenceFlopLimit, beyond it the op's GPU reference on the CUDA backend.
bool has_reference(const OpSpec& op, const Sizes& sizes, std::string_view backend);

// The op's fp32 GPU reference for the inputs in `tensors`, computed by `reference_worker` (a
// worker that never loads candidate code). One vector per output.
std::vector<std::vector<double>> gpu_reference(WorkerClient& reference_worker, const OpSpec& op,
                                               const Sizes& sizes, const CaseTensors& tensors);

class Checker {
 public:
  Checker(const Compiler& compiler, WorkerClient& worker) : compiler_(compiler), worker_(worker) {}

  CheckReport check(const KernelFile& file, const CheckOptions& options,
                    const ProgressFn& progress = {});

  // Compiles `file` for one dtype after checking its requirements; a REJECTED or
  // COMPILE_ERROR verdict comes back in the result's `ok == false` with the log.
  CompileResult build(const KernelFile& file, const ParamValues& params, DType dtype,
                      const std::string& arch, const Sizes* sizes, Verdict* verdict);

  // What build() is asked to compile: a file's parameters (resolved, as build() takes them) in
  // a dtype, with what the header derives from the problem's sizes when `sizes` is given.
  struct BuildRequest {
    const KernelFile* file = nullptr;
    ParamValues params;
    DType dtype = DType::f32;
    const Sizes* sizes = nullptr;
  };
  // Compiles the requests that their files' requirements and the device's limits allow, each
  // distinct variant once, on one thread per core. The builds go to the compile cache, where
  // build() calls that follow find them instead of compiling one after another (a CUTLASS
  // variant compiles for about a minute on one core). `arch` "" is the device's.
  void prebuild(const std::vector<BuildRequest>& requests, const std::string& arch);

  // Runs one problem and compares with the reference. Used by the stages and by `bench`.
  CaseResult run_case(const OpSpec& op, const CompileResult& build, const std::string& stage,
                      const std::string& label, const Sizes& sizes, InputKind kind, uint64_t seed,
                      double tolerance_scale, std::chrono::milliseconds timeout);

  // Runs `build` on the inputs already in `tensors` (outputs are poisoned first) and compares
  // with `*expected`, which is computed on first use and kept there: a problem prepared once
  // can check many builds (the tuner's gate). `result` carries the case's labels.
  CaseResult run_prepared(const OpSpec& op, const CompileResult& build, CaseTensors& tensors,
                          std::vector<std::vector<double>>& expected, CaseResult result,
                          double tolerance_scale, std::chrono::milliseconds timeout);

  // Runs one problem three times in the current worker and once in a fresh one; every output
  // must be bitwise identical. Then a few elements of the first input change and the problem runs
  // once more in that worker, against the reference. `record` receives each case and returns
  // whether it passed.
  bool check_determinism(const OpSpec& op, const CompileResult& build, const SizeCase& size,
                         uint64_t seed, const CheckOptions& options,
                         const std::function<bool(CaseResult)>& record);

  // kforge::has_reference for the worker's backend and the op that checks inputs of `kind`.
  bool has_reference(const OpSpec& op, const Sizes& sizes, InputKind kind) const;

  // Expected outputs (and magnitudes, for ops that ask for them) for the inputs in `tensors`;
  // empty when no reference is available for this problem on this backend.
  std::vector<std::vector<double>> reference_outputs(const OpSpec& op, const Sizes& sizes,
                                                     const CaseTensors& tensors,
                                                     const std::vector<double>& scalars);

  // The sanitizer stage alone, over `builds` (see check/sanitizer.h).
  StageReport sanitize(const OpSpec& op, const std::vector<CompileResult>& builds,
                       const std::vector<std::string>& tools, uint64_t seed,
                       const ProgressFn& progress = {});

  // A worker on the same device that never loads candidate code (GPU references, baselines).
  WorkerClient& clean_worker();

 private:
  // The variant build() compiles (parameters completed with what the header derives from them
  // and from `sizes`, when given), and the first requirement or device limit it breaks ("" if
  // none).
  std::pair<Variant, std::string> resolve(const KernelFile& file, const ParamValues& params,
                                          DType dtype, const std::string& arch, const Sizes* sizes);

  // `arch`, or the device's default when it is "".
  std::string target_arch(const std::string& arch);

  const Compiler& compiler_;
  WorkerClient& worker_;
  std::unique_ptr<WorkerClient> clean_worker_;  // started on first use
};

// Every output in `tensors` against `expected` (as Checker::reference_outputs gives it) within
// the op's tolerance for `dtype`, scaled by `tolerance_scale`: the first failing output's
// comparison, else the first output's.
CompareResult compare_outputs(const OpSpec& op, DType dtype, const CaseTensors& tensors,
                              const std::vector<std::vector<double>>& expected,
                              double tolerance_scale = 1.0);

// Per-run time limit scaled to the data a problem moves.
std::chrono::milliseconds default_timeout(const OpSpec& op, const Sizes& sizes, DType dtype);
// A seed nobody chose: from the clock and the OS.
uint64_t fresh_seed();
uint64_t derive_seed(uint64_t base, std::string_view purpose, uint64_t index);

}  // namespace kforge
