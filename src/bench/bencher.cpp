#include "bench/bencher.h"

#include <fmt/format.h>

#include "core/error.h"
#include "device/cublas_ops.h"

namespace kforge {

namespace {

// Sends a bench request (a module) or a baseline request (a library call) over fresh inputs.
WorkerReply time_request(WorkerClient& worker, const OpSpec& op, const BenchOptions& options,
                         uint64_t seed, const char* kind, const std::filesystem::path* module,
                         std::chrono::milliseconds timeout) {
  CaseTensors tensors(op, options.sizes, options.dtype);
  tensors.generate_inputs(InputKind::normal, seed);
  return time_on_tensors(worker, op, options.sizes, tensors, kind,
                         module ? *module : std::filesystem::path(), options.settings, timeout);
}

std::optional<BaselineResult> time_baseline(Checker& checker, WorkerClient& worker,
                                            const KernelFile& file, const OpSpec& op,
                                            const BenchOptions& options,
                                            const BenchResult& candidate,
                                            std::chrono::milliseconds timeout) {
  BaselineResult b;
  const bool cuda = worker.device().backend == "cuda";
  WorkerReply reply;
  if (cuda && has_library_baseline(op.name())) {
    reply = time_request(worker, op, options, candidate.seed, "baseline", nullptr, timeout);
    if (reply.ok()) b.what = reply.body.value("baseline", "library");
  } else {
    // No vendor library implements the op: the library's own starter is the baseline.
    const auto path = library_kernels_dir() / starter_kernel(op.name(), cuda);
    if (!std::filesystem::exists(path)) return std::nullopt;
    const KernelFile starter = KernelFile::load(path);
    if (starter.source == file.source &&
        candidate.build.variant.params == starter.with_derived(starter.resolve_params(), {})) {
      return std::nullopt;  // the candidate is the starter itself
    }
    Verdict verdict = Verdict::ok;
    const CompileResult build =
        checker.build(starter, starter.resolve_params(), options.dtype,
                      candidate.build.variant.arch, &options.sizes, &verdict);
    b.what = fmt::format("starter {}", build.variant.describe());
    if (verdict != Verdict::ok) {
      b.detail = fmt::format("{}: {}", verdict_name(verdict), build.log);
      return b;
    }
    reply = time_request(worker, op, options, candidate.seed, "bench", &build.module, timeout);
  }
  if (!reply.ok()) {
    b.detail = fmt::format("{}: {}", verdict_name(reply.verdict), reply.detail);
    return b;
  }
  b.ok = true;
  b.stats = summarize(reply.body.at("samples_ms").get<std::vector<double>>());
  b.speedup = candidate.stats.median > 0 ? b.stats.median / candidate.stats.median : 0;
  b.comparison = compare_timings(b.stats, candidate.stats);
  return b;
}

}  // namespace

WorkerReply time_on_tensors(WorkerClient& worker, const OpSpec& op, const Sizes& sizes,
                            CaseTensors& tensors, const char* kind,
                            const std::filesystem::path& module, const BenchSettings& settings,
                            std::chrono::milliseconds timeout) {
  tensors.poison_outputs();
  nlohmann::json request = tensors.request(kind, module, op.scalar_values(sizes));
  request["settings"] = settings;
  request["op_name"] = op.name();
  request["sizes"] = sizes;
  const auto limit = timeout + std::chrono::milliseconds(static_cast<long long>(
                                   1000 * (settings.max_seconds + settings.warmup_seconds) * 2));
  return worker.request(request, limit);
}

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

  const WorkerReply reply =
      time_request(worker, op, options, r.seed, "bench", &r.build.module, timeout);
  if (!reply.ok()) {
    r.verdict = reply.verdict;
    r.detail = "during timing: " + reply.detail;
    return r;
  }
  r.stats = summarize(reply.body.at("samples_ms").get<std::vector<double>>());
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
  if (options.baseline) r.baseline = time_baseline(checker, worker, file, op, options, r, timeout);
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
