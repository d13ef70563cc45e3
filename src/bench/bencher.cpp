#include "bench/bencher.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "device/cublas_ops.h"
#include "tune/library.h"

namespace kforge {

namespace {

// The baseline is kforge's own code (a cuBLAS call, or the op's starter kernel), timed by the
// same path in a worker that never ran the candidate: nothing the candidate left behind can
// slow it down.
std::optional<BaselineResult> time_baseline(Checker& checker, const KernelFile& file,
                                            const OpSpec& op, const BenchOptions& options,
                                            const BenchResult& candidate) {
  BaselineResult b;
  WorkerClient& clean = checker.clean_worker();
  const bool cuda = clean.device().backend == "cuda";
  MeasureOptions measure_options;
  measure_options.settings = options.settings;
  measure_options.verify = false;
  measure_options.timeout = options.timeout;
  TimedTarget target;
  if (cuda && has_library_baseline(op.name())) {
    target.library = true;
  } else {
    // No vendor library implements the op: the library's own starter is the baseline.
    const auto path = device_starter(op, candidate.build.variant.dtype, clean.device());
    if (!std::filesystem::exists(path)) return std::nullopt;
    const KernelFile starter = KernelFile::load(path);
    const ParamValues defaults = starter.resolve_params(candidate.build.variant.dtype);
    const auto& params = candidate.build.variant.params;
    if (starter.source == file.source &&
        std::all_of(defaults.begin(), defaults.end(), [&](const auto& p) {
          const auto it = params.find(p.first);
          return it != params.end() && it->second == p.second;
        })) {
      return std::nullopt;  // the candidate is the starter itself
    }
    Verdict verdict = Verdict::ok;
    const CompileResult build =
        checker.build(starter, starter.resolve_params(options.dtype), options.dtype,
                      candidate.build.variant.arch, &options.sizes, &verdict);
    b.what = fmt::format("starter {}", build.variant.describe());
    if (verdict != Verdict::ok) {
      b.detail = fmt::format("{}: {}", verdict_name(verdict), build.log);
      return b;
    }
    target.module = build.module;
  }
  const Measurement m =
      measure(checker, clean, op, options.sizes, options.dtype, target, nullptr, measure_options);
  if (target.library) b.what = m.library.empty() ? "library" : m.library;
  if (!m.timed()) {
    b.detail = fmt::format("{}: {}", verdict_name(m.verdict), m.detail);
    return b;
  }
  b.ok = true;
  b.stats = m.stats;
  b.speedup = candidate.stats.median > 0 ? b.stats.median / candidate.stats.median : 0;
  b.comparison = compare_timings(b.stats, candidate.stats);
  return b;
}

}  // namespace

BenchResult bench_kernel(Checker& checker, WorkerClient& worker, const KernelFile& file,
                         const OpSpec& op, const BenchOptions& options, const Ceilings& ceilings) {
  BenchResult r;
  r.sizes = options.sizes;
  r.dtype = options.dtype;
  r.seed = options.seed ? options.seed : fresh_seed();
  if (!file.supports(options.dtype) || !op.supports(options.dtype)) {
    throw UsageError(
        fmt::format("{} does not support dtype {}", file.path.string(), dtype_name(options.dtype)));
  }
  const std::string arch = options.arch.empty() ? worker.device().default_arch() : options.arch;
  r.build = checker.build(file, file.resolve_params(options.dtype, options.params), options.dtype,
                          arch, &options.sizes, &r.verdict);
  if (r.verdict != Verdict::ok) {
    r.detail = r.build.log;
    return r;
  }
  const auto timeout = options.timeout.count() > 0
                           ? options.timeout
                           : default_timeout(op, options.sizes, options.dtype);

  // Never time what is not correct: the benchmarked problem itself must pass first.
  const CaseResult gate = checker.run_case(op, r.build, "bench_gate", "bench", options.sizes,
                                           InputKind::normal, r.seed, 1.0, timeout);
  if (gate.verdict != Verdict::ok) {
    r.verdict = gate.verdict;
    r.detail = "correctness at the benchmarked problem: " + gate.detail;
    r.measurement.output = gate.output;
    return r;
  }

  MeasureOptions measure_options;
  measure_options.settings = options.settings;
  measure_options.timeout = timeout;
  r.measurement = measure(checker, worker, op, options.sizes, options.dtype,
                          TimedTarget{r.build.module}, &ceilings, measure_options);
  r.measurement.output = gate.output + r.measurement.output;
  const Measurement& m = r.measurement;
  if (!m.timed()) {
    r.verdict = m.verdict == Verdict::ok ? Verdict::invalid : m.verdict;
    r.detail = m.verdict == Verdict::ok ? "no sample was kept: " + m.stop_reason : m.detail;
    return r;
  }
  r.stats = m.stats;
  r.throttled_samples = m.throttled_samples;
  r.clock_monitored = m.clock_monitored;
  r.sm_clock_mhz = m.sm_clock_mhz;
  r.stop_reason = m.stop_reason;
  r.cost = op.cost(options.sizes, options.dtype);
  if (r.stats.median > 0) {
    const double seconds = r.stats.median * 1e-3;
    r.gbps = r.cost.bytes / seconds / 1e9;
    r.tflops = r.cost.flops / seconds / 1e12;
    if (ceilings.copy_gbps > 0) r.pct_of_copy = 100.0 * r.gbps / ceilings.copy_gbps;
    if (ceilings.matmul_tflops) r.pct_of_matmul = 100.0 * r.tflops / *ceilings.matmul_tflops;
  }
  // Whatever the candidate may have left in its worker goes before the baseline is timed.
  worker.restart();
  if (options.baseline) r.baseline = time_baseline(checker, file, op, options, r);
  return r;
}

nlohmann::json BenchResult::to_json(const OpSpec& op) const {
  const auto baseline_json = [&]() -> nlohmann::json {
    if (!baseline) return nullptr;
    return {{"what", baseline->what},
            {"ok", baseline->ok},
            {"detail", baseline->detail},
            {"time_us",
             {{"median", baseline->stats.median * 1e3},
              {"p10", baseline->stats.p10 * 1e3},
              {"p90", baseline->stats.p90 * 1e3},
              {"rel_noise", baseline->stats.rel_noise},
              {"samples", baseline->stats.count}}},
            {"speedup", baseline->speedup},
            {"candidate_vs_baseline", comparison_name(baseline->comparison)}};
  };
  const auto number_or_null = [](double v) {
    return std::isnan(v) ? nlohmann::json() : nlohmann::json(v);
  };
  return {{"variant", build.variant.describe()},
          {"variant_key", build.variant.key()},
          {"params", build.variant.params},
          {"resources", build.resources.summary()},
          {"op", op.name()},
          {"shape", op.format_shape(sizes)},
          {"dtype", dtype_name(dtype)},
          {"seed", seed},
          {"verdict", verdict_name(verdict)},
          {"detail", detail},
          {"integrity", measurement.to_json()},
          {"time_us",
           {{"median", stats.median * 1e3},
            {"mean", stats.mean * 1e3},
            {"min", stats.min * 1e3},
            {"max", stats.max * 1e3},
            {"p10", stats.p10 * 1e3},
            {"p90", stats.p90 * 1e3},
            {"rel_noise", stats.rel_noise},
            {"rel_stderr", stats.rel_stderr},
            {"samples", stats.count}}},
          {"throttled_samples_discarded", throttled_samples},
          {"clock_monitored", clock_monitored},
          {"sm_clock_mhz_median", sm_clock_mhz},
          {"stop_reason", stop_reason},
          {"bytes", cost.bytes},
          {"flops", cost.flops},
          {"gbps", gbps},
          {"tflops", tflops},
          {"pct_of_copy_ceiling", number_or_null(pct_of_copy)},
          {"pct_of_matmul_ceiling", number_or_null(pct_of_matmul)},
          {"baseline", baseline_json()}};
}

}  // namespace kforge
