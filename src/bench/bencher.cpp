#include "bench/bencher.h"

#include <fmt/format.h>

#include "core/error.h"

namespace kforge {

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
  r.build = checker.build(file, file.resolve_params(options.params), options.dtype, arch,
                          &options.sizes, &r.verdict);
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
    return r;
  }

  CaseTensors tensors(op, options.sizes, options.dtype);
  tensors.generate_inputs(InputKind::normal, r.seed);
  tensors.poison_outputs();
  const std::vector<double> scalars = op.scalar_values(options.sizes);
  nlohmann::json request = tensors.request("bench", r.build.module, scalars);
  request["settings"] = options.settings;
  const auto bench_timeout =
      timeout + std::chrono::milliseconds(static_cast<long long>(
                    1000 * (options.settings.max_seconds + options.settings.warmup_seconds) * 2));
  const WorkerReply reply = worker.request(request, bench_timeout);
  if (!reply.ok()) {
    r.verdict = reply.verdict;
    r.detail = "during timing: " + reply.detail;
    return r;
  }
  const auto samples = reply.body.at("samples_ms").get<std::vector<double>>();
  r.stats = summarize(samples);
  r.throttled_samples = reply.body.at("throttled_samples");
  r.clock_monitored = reply.body.at("clock_monitored");
  r.sm_clock_mhz = reply.body.value("sm_clock_mhz_median", 0);
  r.stop_reason = reply.body.at("stop_reason");
  r.cost = op.cost(options.sizes, options.dtype);
  if (r.stats.median > 0) {
    const double seconds = r.stats.median * 1e-3;
    r.gbps = r.cost.bytes / seconds / 1e9;
    r.tflops = r.cost.flops / seconds / 1e12;
    if (ceilings.copy_gbps > 0) r.pct_of_copy = 100.0 * r.gbps / ceilings.copy_gbps;
    if (ceilings.matmul_tflops) r.pct_of_matmul = 100.0 * r.tflops / *ceilings.matmul_tflops;
  }
  return r;
}

nlohmann::json BenchResult::to_json(const OpSpec& op) const {
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
          {"pct_of_matmul_ceiling", number_or_null(pct_of_matmul)}};
}

}  // namespace kforge
