#include "loop/experiment.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "bench/bencher.h"
#include "bench/statistics.h"
#include "compile/linkage.h"
#include "core/error.h"
#include "core/json_file.h"

namespace kforge {
namespace fs = std::filesystem;

LoopTask LoopTask::from_json(const nlohmann::json& task) {
  LoopTask t;
  const std::string op = task.value("op", "");
  t.op = find_op(op);
  if (!t.op) throw UsageError(fmt::format("task names no known op ('{}')", op));
  t.sizes = t.op->parse_shape(task.value("shape", ""));
  t.op->complete_sizes(t.sizes);
  const auto dtype = parse_dtype(task.value("dtype", ""));
  if (!dtype || !t.op->supports(*dtype)) {
    throw UsageError(
        fmt::format("task's dtype '{}' is not one of {}'s", task.value("dtype", ""), op));
  }
  t.dtype = *dtype;
  return t;
}

namespace {

nlohmann::json timing_json(const BenchResult& r) {
  // The share of the roofline bound reached: the bound is set by whichever of memory and
  // compute takes longer at the ceilings, so it is the larger of the two fractions.
  double roofline = 0;
  for (const double pct : {r.pct_of_copy, r.pct_of_matmul}) {
    if (std::isfinite(pct)) roofline = std::max(roofline, pct / 100.0);
  }
  return {{"median_us", r.stats.median * 1e3},
          {"roofline_fraction", roofline},
          {"min_us", r.stats.min * 1e3},
          {"p10_us", r.stats.p10 * 1e3},
          {"p90_us", r.stats.p90 * 1e3},
          {"rel_noise", r.stats.rel_noise},
          {"rel_stderr", r.stats.rel_stderr},
          {"samples", r.stats.count},
          {"seed", r.seed},
          {"variant", r.build.variant.describe()}};
}

BenchResult time_file(Checker& checker, WorkerClient& worker, const Ceilings& ceilings,
                      const KernelFile& file, const LoopTask& task,
                      const EvaluationOptions& options) {
  BenchOptions bench;
  bench.sizes = task.sizes;
  bench.dtype = task.dtype;
  bench.settings = options.settings;
  bench.baseline = false;
  return bench_kernel(checker, worker, file, *task.op, bench, ceilings);
}

}  // namespace

ExperimentRecord evaluate_proposal(Checker& checker, WorkerClient& worker, const Ceilings& ceilings,
                                   const LoopTask& task, const fs::path& proposal,
                                   const fs::path& best, const EvaluationOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  ExperimentRecord record;
  const auto done = [&](std::string verdict) {
    record.verdict = std::move(verdict);
    record.fields["wall_seconds"] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return record;
  };

  // A proposal that is the best byte for byte (a search proposing the point it stands on) has
  // nothing to gain, and comparing it with itself would only give noise a chance to pass for a
  // gain. The best is timed once, for the record (a search's cost, the task's start).
  if (read_text_file(proposal) == read_text_file(best)) {
    const BenchResult timed =
        time_file(checker, worker, ceilings, KernelFile::load(best), task, options);
    if (timed.verdict == Verdict::ok) {
      record.time_us = timed.stats.median * 1e3;
      record.fields["best"] = timing_json(timed);
    }
    record.fields["detail"] = "the proposal is the task's best as it is";
    return done("UNCHANGED");
  }

  std::optional<KernelFile> file;
  try {
    file = KernelFile::load(proposal);
  } catch (const std::exception& e) {
    record.fields["detail"] = e.what();
    return done("BAD_FILE");
  }
  if (file->op != task.op->name()) {
    record.fields["detail"] =
        fmt::format("the proposal is a {} kernel; the task's op is {}", file->op, task.op->name());
    return done("BAD_FILE");
  }

  CheckOptions check;
  check.dtypes = {task.dtype};
  const CheckReport report = checker.check(*file, check);
  if (!report.passed()) {
    record.fields["failing_stage"] = "build";
    for (const auto& s : report.stages) {
      if (s.ran && !s.passed) {
        record.fields["failing_stage"] = s.name;
        // The failing case's comparison: counts, worst errors, first mismatches with indices.
        for (const CaseResult& c : s.results) {
          if (c.verdict != Verdict::ok && !c.compare.first.empty()) {
            record.fields["mismatches"] = c.compare.to_json();
            record.fields["mismatches"]["case"] = c.label;
            break;
          }
        }
        break;
      }
    }
    record.fields["detail"] = report.detail;
    record.fields["check_seed"] = report.seed;
    for (const auto& b : report.builds) {
      if (!b.ok) record.fields["compiler_log"] = b.log;
    }
    return done(std::string(verdict_name(report.verdict)));
  }
  record.fields["check_seed"] = report.seed;

  // A kept CUDA file goes on to `kforge export --workspace`, which links it into one library
  // beside the op's library variants: one defining code of its own with external linkage is
  // refused here, where the proposer can still mend it, rather than at the export.
  if (file->backend == Backend::cuda) {
    for (const CompileResult& b : report.builds) {
      if (!b.ok) continue;
      const std::vector<std::string> shared =
          symbols_shared_between_variants(b.module, file->source);
      if (!shared.empty()) {
        record.fields["failing_stage"] = "linkage";
        record.fields["detail"] = describe_shared_symbols(proposal.filename().string(), shared);
        return done("BAD_FILE");
      }
    }
  }

  // The best is timed before and after the proposal (A B A), so that drift over the
  // experiment (clocks, temperature, a neighbour on the host) cannot pass for a gain: the
  // proposal is kept only when it is faster than both, in the medians and in the fastest
  // samples (compare_aba). A keep is then confirmed by a second pair (A B A B A): interference
  // that happened to fall on both timings of the best is unlikely to fall that way twice.
  const KernelFile best_file = KernelFile::load(best);
  const auto time_best = [&] {
    BenchResult b = time_file(checker, worker, ceilings, best_file, task, options);
    if (b.verdict != Verdict::ok) {
      throw Error(fmt::format("the task's best kernel {} no longer times: {} ({})", best.string(),
                              verdict_name(b.verdict), b.detail));
    }
    return b;
  };
  const BenchResult before = time_best();
  const BenchResult after = time_file(checker, worker, ceilings, *file, task, options);
  if (after.verdict != Verdict::ok) {
    record.fields["failing_stage"] = "timing";
    record.fields["detail"] = after.detail;
    return done(std::string(verdict_name(after.verdict)));
  }
  const BenchResult before_again = time_best();
  record.time_us = after.stats.median * 1e3;
  record.fields["best"] = timing_json(before);
  record.fields["best_again"] = timing_json(before_again);
  record.fields["proposal"] = timing_json(after);
  record.fields["resources"] = after.build.resources.summary();
  const AbaComparison c =
      compare_aba(before.stats, after.stats, before_again.stats, options.min_gain);
  record.fields["comparison"] = comparison_name(c.before);
  record.fields["comparison_again"] = comparison_name(c.after);
  record.fields["gain_vs_best"] = c.median_gain;
  record.fields["fastest_gain_vs_best"] = c.fastest_gain;
  if (!c.faster) return done("REVERT");

  const BenchResult confirming = time_file(checker, worker, ceilings, *file, task, options);
  if (confirming.verdict != Verdict::ok) {
    record.fields["failing_stage"] = "timing";
    record.fields["detail"] = "timed again to confirm the gain: " + confirming.detail;
    return done(std::string(verdict_name(confirming.verdict)));
  }
  const BenchResult best_last = time_best();
  const AbaComparison confirmed =
      compare_aba(before_again.stats, confirming.stats, best_last.stats, options.min_gain);
  record.fields["confirmation"] = {{"proposal", timing_json(confirming)},
                                   {"best", timing_json(best_last)},
                                   {"comparison", comparison_name(confirmed.before)},
                                   {"comparison_again", comparison_name(confirmed.after)},
                                   {"gain_vs_best", confirmed.median_gain},
                                   {"fastest_gain_vs_best", confirmed.fastest_gain}};
  record.kept = confirmed.faster;
  return done(record.kept ? "KEEP" : "REVERT");
}

double start_us(const std::vector<ExperimentRecord>& history) {
  for (const auto& r : history) {
    if (r.fields.contains("best")) return r.fields.at("best").value("median_us", 0.0);
  }
  return 0;
}

double best_us(const std::vector<ExperimentRecord>& history) {
  for (auto r = history.rbegin(); r != history.rend(); ++r) {
    if (r->kept) return r->time_us;
  }
  return start_us(history);
}

double best_speedup(const std::vector<ExperimentRecord>& history) {
  const double start = start_us(history);
  const double best = best_us(history);
  return start > 0 && best > 0 ? start / best : 1.0;
}

nlohmann::json best_timing(const std::vector<ExperimentRecord>& history) {
  for (auto r = history.rbegin(); r != history.rend(); ++r) {
    const char* timing = r->kept ? "proposal" : "best";
    if (r->fields.contains(timing)) return r->fields.at(timing);
  }
  return nlohmann::json::object();
}

int not_kept_in_a_row(const std::vector<ExperimentRecord>& history) {
  int in_a_row = 0;
  for (auto r = history.rbegin(); r != history.rend() && !r->kept; ++r)
    ++in_a_row;
  return in_a_row;
}

}  // namespace kforge
