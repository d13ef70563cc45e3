#include "tune/tuner.h"

#include <algorithm>
#include <deque>
#include <future>
#include <mutex>
#include <semaphore>
#include <thread>

#include <fmt/format.h>

#include "bench/measurement.h"
#include "check/sanitizer.h"
#include "core/error.h"
#include "core/run_info.h"
#include "device/cublas_ops.h"
#include "device/launch_limits.h"
#include "tune/occupancy.h"
#include "tune/strategy.h"

namespace kforge {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Where evaluations come from: the compiler and the device, or the database alone. Results
// come back in submission order.
class Evaluator {
 public:
  virtual ~Evaluator() = default;
  virtual void submit(PointId point) = 0;
  virtual TuneEvaluation next() = 0;
};

EvaluationRecord new_record(const TuneProblem& problem, const std::string& device,
                            const Variant& variant) {
  EvaluationRecord r;
  r.variant_key = variant.key();
  r.problem = problem.key();
  r.device = device;
  r.file = variant.file_name;
  r.variant = variant.describe();
  r.params = variant.params;
  return r;
}

Variant variant_at(const SearchSpace& space, PointId point, DType dtype, const std::string& arch) {
  const KernelFile& file = *space.files()[space.point(point).file];
  return Variant::make(file, space.values(point), dtype, arch);
}

// A failure's detail, with the start of what the kernel printed when it printed anything.
std::string with_output(std::string detail, const std::string& output) {
  if (!output.empty()) detail += "; it printed: " + truncate_middle(output, 300);
  return detail;
}

// The last lines of a compiler log: enough to see the error in a table or a database row.
std::string log_tail(const std::string& log, size_t max_bytes = 600) {
  return log.size() <= max_bytes ? log : "..." + log.substr(log.size() - max_bytes);
}

class LiveEvaluator final : public Evaluator {
 public:
  LiveEvaluator(const SearchSpace& space, const TuneProblem& problem, const TuneOptions& options,
                const std::string& arch, ResultsDb& db, const Compiler& compiler, Checker& checker,
                WorkerClient& worker, TuneReport& report)
      : space_(space),
        problem_(problem),
        options_(options),
        arch_(arch),
        db_(db),
        compiler_(compiler),
        checker_(checker),
        worker_(worker),
        report_(report),
        device_key_(device_key(worker.device())),
        compile_slots_(options.compile_jobs ? options.compile_jobs
                                            : std::max(1u, std::thread::hardware_concurrency())),
        input_seed_(fresh_seed()) {}

  ~LiveEvaluator() override {
    for (auto& p : pending_) {
      if (p.build.valid()) p.build.wait();
    }
  }

  void submit(PointId point) override {
    Pending p{point, variant_at(space_, point, problem_.dtype, arch_)};
    if (options_.use_database) {
      p.known = db_.find(p.variant.key(), problem_.key(), device_key_);
      // Recorded by another timing method (older rules): not trusted, evaluated again.
      if (p.known && p.known->method != kMeasurementMethod) p.known.reset();
    }
    if (!p.known) {
      const KernelFile* file = space_.files()[space_.point(point).file];
      p.build = std::async(std::launch::async, [this, file, variant = p.variant] {
        compile_slots_.acquire();
        const auto start = Clock::now();
        CompileResult r = compiler_.compile(*file, variant);
        compile_slots_.release();
        note_compile(start, r);
        return r;
      });
    }
    pending_.push_back(std::move(p));
  }

  TuneEvaluation next() override {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    if (p.known) return {p.point, *p.known, true};
    const auto wait_start = Clock::now();
    const CompileResult build = p.build.get();
    if (evaluated_on_device_ > 0) report_.device_wait_seconds += seconds_since(wait_start);
    EvaluationRecord r = evaluate(p.point, build);
    db_.put(r);
    ++evaluated_on_device_;
    return {p.point, std::move(r), false};
  }

  // Compile throughput is measured over the time at least one compile was running (the union
  // of their intervals), so idle gaps while the device catches up do not count.
  double compile_busy_seconds() {
    std::lock_guard lock(compile_mutex_);
    std::sort(compile_intervals_.begin(), compile_intervals_.end());
    double busy = 0;
    Clock::time_point covered_to{};
    for (const auto& [from, to] : compile_intervals_) {
      const auto begin = std::max(from, covered_to);
      if (to > begin) busy += std::chrono::duration<double>(to - begin).count();
      covered_to = std::max(covered_to, to);
    }
    return busy;
  }

 private:
  struct Pending {
    PointId point;
    Variant variant;
    std::optional<EvaluationRecord> known;
    std::future<CompileResult> build;
  };

  void note_compile(Clock::time_point start, const CompileResult& r) {
    std::lock_guard lock(compile_mutex_);
    if (r.from_cache) return;
    compile_intervals_.emplace_back(start, Clock::now());
    ++report_.compiled;
    report_.compile_seconds_sum += r.seconds;
  }

  // The tuned problem's inputs and reference, made once for every candidate.
  CaseTensors& fixture() {
    if (!tensors_) {
      tensors_.emplace(*problem_.op, problem_.sizes, problem_.dtype);
      tensors_->generate_inputs(InputKind::normal, input_seed_);
    }
    return *tensors_;
  }

  EvaluationRecord evaluate(size_t point, const CompileResult& build) {
    const OpSpec& op = *problem_.op;
    const KernelFile& file = *space_.files()[space_.point(point).file];
    EvaluationRecord r = new_record(problem_, device_key_, build.variant);
    r.method = kMeasurementMethod;
    r.compile_seconds = build.seconds;
    r.seed = input_seed_;
    r.registers = build.resources.max_registers();
    r.static_shared_bytes = build.resources.max_static_shared_bytes();
    for (const auto& f : build.resources.functions)
      r.spill_bytes = std::max(r.spill_bytes, f.spill_store_bytes + f.spill_load_bytes);
    const auto fail = [&](Verdict v, const char* stage, std::string detail) {
      r.verdict = v;
      r.stage = stage;
      r.detail = std::move(detail);
      return r;
    };
    if (!build.ok) return fail(Verdict::compile_error, "compile", log_tail(build.log));
    std::optional<Occupancy> occupancy;
    if (auto why =
            post_compile_rejection(build.resources, space_.launch_shape(point), worker_.device(),
                                   file.min_occupancy_percent, &occupancy)) {
      return fail(Verdict::rejected, "resources", *why);
    }
    if (occupancy) r.occupancy = occupancy->fraction;

    const SizeCase smoke = op.test_sizes().front();
    const CaseResult s =
        checker_.run_case(op, build, "smoke", smoke.label, smoke.sizes, InputKind::normal,
                          derive_seed(input_seed_, "smoke", point), 1.0,
                          default_timeout(op, smoke.sizes, problem_.dtype));
    if (s.verdict != Verdict::ok) return fail(s.verdict, "smoke", with_output(s.detail, s.output));

    const auto timeout = default_timeout(op, problem_.sizes, problem_.dtype);
    const CaseResult g = checker_.run_prepared(
        op, build, fixture(), expected_,
        CaseResult{"gate", "tuned", problem_.sizes, problem_.dtype, InputKind::normal, input_seed_},
        1.0, timeout);
    if (g.verdict != Verdict::ok) return fail(g.verdict, "gate", with_output(g.detail, g.output));
    if (g.skipped) return fail(Verdict::rejected, "gate", g.detail);

    MeasureOptions measure_options;
    measure_options.settings = options_.bench;
    measure_options.random_checks = 0;  // the fastest, the median and the trap are checked
    measure_options.timeout = timeout;
    const Measurement m =
        measure(checker_, worker_, op, problem_.sizes, problem_.dtype, TimedTarget{build.module},
                options_.ceilings, measure_options, &measured_inputs());
    if (!m.timed()) {
      const std::string detail =
          m.verdict == Verdict::ok ? "no sample kept: " + m.stop_reason : m.detail;
      return fail(m.verdict == Verdict::ok ? Verdict::invalid : m.verdict, "timing",
                  with_output(detail, m.output));
    }
    r.stats = m.stats;
    r.stage = "timed";
    return r;
  }

  // Inputs for the first, untimed call of each measurement (the timed samples draw their own).
  // Kept apart from the gate's fixture: a measurement leaves its last checked sample here.
  CaseTensors& measured_inputs() {
    if (!measured_) {
      measured_.emplace(*problem_.op, problem_.sizes, problem_.dtype);
      measured_->generate_inputs(InputKind::normal, derive_seed(input_seed_, "measure", 0));
    }
    return *measured_;
  }

  const SearchSpace& space_;
  const TuneProblem& problem_;
  const TuneOptions& options_;
  std::string arch_;
  ResultsDb& db_;
  const Compiler& compiler_;
  Checker& checker_;
  WorkerClient& worker_;
  TuneReport& report_;
  std::string device_key_;
  std::counting_semaphore<1024> compile_slots_;
  uint64_t input_seed_;
  std::deque<Pending> pending_;
  std::optional<CaseTensors> tensors_;
  std::optional<CaseTensors> measured_;
  std::vector<std::vector<double>> expected_;
  size_t evaluated_on_device_ = 0;
  std::mutex compile_mutex_;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> compile_intervals_;
};

class ReplayEvaluator final : public Evaluator {
 public:
  ReplayEvaluator(const SearchSpace& space, const TuneProblem& problem, std::string device,
                  std::string arch, const ResultsDb& db, TuneReport& report)
      : space_(space),
        problem_(problem),
        device_(std::move(device)),
        arch_(std::move(arch)),
        db_(db),
        report_(report) {}

  void submit(PointId point) override { queue_.push_back(point); }

  TuneEvaluation next() override {
    const PointId point = queue_.front();
    queue_.pop_front();
    const Variant variant = variant_at(space_, point, problem_.dtype, arch_);
    if (auto known = db_.find(variant.key(), problem_.key(), device_)) {
      return {point, std::move(*known), true};
    }
    ++report_.missing_in_replay;
    EvaluationRecord r = new_record(problem_, device_, variant);
    r.verdict = Verdict::rejected;
    r.stage = "not recorded";
    r.detail = "no recorded evaluation of this variant";
    return {point, std::move(r), false};
  }

 private:
  const SearchSpace& space_;
  const TuneProblem& problem_;
  std::string device_;
  std::string arch_;
  const ResultsDb& db_;
  TuneReport& report_;
  std::deque<PointId> queue_;
};

uint64_t strategy_seed(const TuneProblem& problem, const TuneOptions& options) {
  if (options.seed) return options.seed;
  return derive_seed(0, problem.key() + " " + options.strategy, 0);
}

void tally(TuneReport& report, const TuneEvaluation& e) {
  const EvaluationRecord& r = e.record;
  if (r.timed()) return;
  if (r.stage == "resources") {
    ++report.rejected_after_compile[r.detail];
  } else {
    ++report.failed[fmt::format("{} at {}", verdict_name(r.verdict), r.stage)];
  }
}

// The loop both tune() and replay() run: keep `lookahead` proposals in flight, observe results
// in proposal order, stop at the budget or when the strategy has nothing left.
void search(const SearchSpace& space, Strategy& strategy, Evaluator& evaluator, TuneOptions options,
            TuneReport& report, const TuneProgressFn& progress, Clock::time_point start) {
  if (options.max_fraction > 0) {
    // Rounded down: "25%" never means more than a quarter (of the estimate, when the counts
    // are estimated).
    const auto share = std::max<size_t>(
        1, static_cast<size_t>(options.max_fraction * static_cast<double>(space.size())));
    options.max_evaluations =
        options.max_evaluations ? std::min(options.max_evaluations, share) : share;
  }
  size_t in_flight = 0;  // proposed, not yet observed
  size_t proposed = 0;
  TuneProgress state;
  state.budget = options.max_evaluations;
  for (;;) {
    while (in_flight < std::max<size_t>(1, options.lookahead)) {
      if (options.max_evaluations && proposed >= options.max_evaluations) {
        report.stop_reason = fmt::format("evaluation budget ({})", options.max_evaluations);
        break;
      }
      if (options.max_seconds > 0 && seconds_since(start) > options.max_seconds) {
        report.stop_reason = fmt::format("time budget ({:g} s)", options.max_seconds);
        break;
      }
      const auto p = strategy.propose();
      if (!p) break;
      evaluator.submit(*p);
      ++in_flight;
      ++proposed;
    }
    if (in_flight == 0) break;
    TuneEvaluation e = evaluator.next();
    --in_flight;
    strategy.observe(e.point, e.record.cost());
    tally(report, e);
    report.evaluations.push_back(std::move(e));
    const auto& last = report.evaluations.back();
    ++state.evaluated;
    if (last.record.timed()) {
      ++state.valid;
      if (!state.best_ms || last.record.stats.median < *state.best_ms) {
        state.best_ms = last.record.stats.median;
      }
    }
    state.last = &last;
    if (progress) progress(state);
  }
  if (report.stop_reason.empty()) {
    report.stop_reason = space.ranked() && proposed >= space.size()
                             ? "every feasible variant evaluated"
                             : "strategy finished";
  }
}

void pick_best(TuneReport& report, const std::optional<PointId>& default_point) {
  report.best.reset();
  report.baseline.reset();
  for (size_t i = 0; i < report.evaluations.size(); ++i) {
    const auto& e = report.evaluations[i];
    if (default_point && e.point == *default_point) report.baseline = i;
    if (!e.record.timed()) continue;
    if (!report.best || e.record.cost() < report.evaluations[*report.best].record.cost()) {
      report.best = i;
    }
  }
}

// Solves the space for `device` and records the problem, strategy and space in `report`.
SearchSpace solve_into(TuneReport& report, const std::vector<const KernelFile*>& files,
                       const TuneProblem& problem, const TuneOptions& options,
                       const DeviceInfo& device) {
  report.problem = problem;
  report.device = device_key(device);
  report.strategy = options.strategy;
  report.seed = strategy_seed(problem, options);
  SearchSpace space = SearchSpace::solve(files, tune_context(device, problem), device);
  report.raw_size = space.raw_size();
  report.feasible = space.size();
  report.estimate_samples = space.estimate_samples();
  report.solve_seconds = space.solve_seconds();
  report.pruned_before_compile = space.pruned();
  return space;
}

// The feasible points of `options.starts`, in order; the others are noted in `report`.
std::vector<PointId> start_points(const SearchSpace& space, const TuneOptions& options,
                                  TuneReport& report) {
  std::vector<PointId> points;
  for (const TuneStart& s : options.starts) {
    const auto& files = space.files();
    const auto file = std::find_if(files.begin(), files.end(), [&](const KernelFile* f) {
      return f->path.filename().string() == s.file;
    });
    if (file == files.end()) {
      report.starts_skipped.push_back(fmt::format("{}: {} is not searched", s.origin, s.file));
      continue;
    }
    const auto p = space.point_with(static_cast<int>(file - files.begin()), s.tunables);
    if (!p) {
      report.starts_skipped.push_back(
          fmt::format("{}: not a feasible variant for this problem here", s.origin));
      continue;
    }
    if (std::find(points.begin(), points.end(), *p) == points.end()) points.push_back(*p);
    report.starts_used.push_back(s.origin);
  }
  return points;
}

// Runs the search, then evaluates the file's defaults (the baseline) if the strategy did not.
void search_with_baseline(const SearchSpace& space, Evaluator& evaluator,
                          const TuneOptions& options, TuneReport& report,
                          const TuneProgressFn& progress, Clock::time_point start) {
  auto strategy =
      make_strategy(options.strategy, space, report.seed, start_points(space, options, report));
  search(space, *strategy, evaluator, options, report, progress, start);
  const auto default_point = space.size() ? space.default_point(0) : std::nullopt;
  pick_best(report, default_point);
  if (default_point && !report.baseline) {
    evaluator.submit(*default_point);
    report.evaluations.push_back(evaluator.next());
    report.baseline = report.evaluations.size() - 1;
    tally(report, report.evaluations.back());
    pick_best(report, default_point);
  }
}

}  // namespace

std::string TuneProblem::key() const {
  return fmt::format("{} {} {}", op->name(), op->format_shape(sizes), dtype_name(dtype));
}

BenchSettings tuning_bench_settings() {
  BenchSettings s;
  s.warmup_seconds = 0.02;
  s.min_samples = 15;
  s.min_seconds = 0.02;
  s.max_seconds = 1.0;
  s.target_rel_stderr = 0.005;
  return s;
}

Bindings tune_context(const DeviceInfo& device, const TuneProblem& problem) {
  return problem_bindings(device, problem.dtype, &problem.sizes);
}

double TuneReport::compile_throughput() const {
  return compile_busy_seconds > 0 ? static_cast<double>(compiled) / compile_busy_seconds : 0;
}

double TuneReport::compile_seconds_per_variant() const {
  return compiled ? compile_seconds_sum / static_cast<double>(compiled) : 0;
}

std::vector<size_t> TuneReport::ranked() const {
  std::vector<size_t> order;
  for (size_t i = 0; i < evaluations.size(); ++i) {
    if (evaluations[i].record.timed()) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return evaluations[a].record.cost() < evaluations[b].record.cost();
  });
  return order;
}

size_t TuneReport::from_database_count() const {
  return static_cast<size_t>(std::count_if(evaluations.begin(), evaluations.end(),
                                           [](const auto& e) { return e.from_database; }));
}

double TuneReport::compile_capacity() const {
  return compile_seconds_sum > 0 ? static_cast<double>(compile_jobs) *
                                       static_cast<double>(compiled) / compile_seconds_sum
                                 : 0;
}

TuneReport Tuner::tune(const std::vector<const KernelFile*>& files, const TuneProblem& problem,
                       const TuneOptions& options, const TuneProgressFn& progress,
                       const std::function<void(const std::string&)>& say) {
  if (!compiler_ || !checker_ || !worker_) throw Error("a live tune needs a compiler and a worker");
  const auto start = Clock::now();
  const OpSpec& op = *problem.op;
  const DeviceInfo& device = worker_->device();
  const bool cuda = device.backend == "cuda";
  if (op.reference_flops(problem.sizes) > kHostReferenceFlopLimit &&
      !(cuda && has_gpu_reference(op.name()))) {
    throw UsageError(fmt::format(
        "{} at {} is too large for the host reference and {} has no GPU reference here: "
        "candidates could not be checked at the tuned size",
        op.name(), op.format_shape(problem.sizes), op.name()));
  }
  for (const KernelFile* f : files) {
    if (!f->supports(problem.dtype)) {
      throw UsageError(
          fmt::format("{} does not support dtype {}", f->path.string(), dtype_name(problem.dtype)));
    }
  }
  const std::string arch = options.arch.empty() ? device.default_arch() : options.arch;

  TuneReport report;
  const SearchSpace space = solve_into(report, files, problem, options, device);

  db_.put_device(device);
  std::vector<std::string> file_names;
  for (const KernelFile* f : files)
    file_names.push_back(f->path.string());
  const int64_t tune_id = db_.begin_tune(problem.key(), report.device,
                                         {{"strategy", options.strategy},
                                          {"seed", report.seed},
                                          {"max_evaluations", options.max_evaluations},
                                          {"max_fraction", options.max_fraction},
                                          {"max_seconds", options.max_seconds},
                                          {"lookahead", options.lookahead},
                                          {"starts", options.starts.size()},
                                          {"files", file_names},
                                          {"git_sha", git_state().sha}});

  report.compile_jobs = options.compile_jobs ? options.compile_jobs
                                             : std::max(1u, std::thread::hardware_concurrency());
  LiveEvaluator evaluator(space, problem, options, arch, db_, *compiler_, *checker_, *worker_,
                          report);
  search_with_baseline(space, evaluator, options, report, progress, start);
  report.compile_busy_seconds = evaluator.compile_busy_seconds();
  const auto default_point = space.size() ? space.default_point(0) : std::nullopt;

  // The winner must pass all five stages, and on a GPU memcheck and racecheck too; a failure
  // is recorded and the next best is tried. Without compute-sanitizer a CUDA winner passes the
  // five stages but is not recorded as checked.
  const bool sanitize = cuda && options.final_check;
  const bool sanitizer_found = !sanitize || find_compute_sanitizer().has_value();
  while (options.final_check && report.best) {
    TuneEvaluation& best = report.evaluations[*report.best];
    if (best.record.stage == "checked") {
      report.final_check = "PASS (recorded)";
      break;
    }
    const KernelFile& file = *space.files()[space.point(best.point).file];
    CheckOptions check;
    check.dtypes = {problem.dtype};
    check.arch = arch;
    if (sanitize && sanitizer_found) check.sanitizer_tools = winner_sanitizer_tools();
    for (const auto& p : file.params)
      check.params[p.name] = best.record.params.at(p.name).get<long long>();
    if (say) {
      say(fmt::format("final check of the winner {}: five stages{}", best.record.variant,
                      check.sanitizer_tools.empty() ? "" : ", memcheck and racecheck"));
    }
    const CheckReport r = checker_->check(file, check, say);
    if (r.passed() && !sanitizer_found) {
      report.final_check = fmt::format(
          "PASS five stages (seed {}), but not recorded as checked: compute-sanitizer was not "
          "found for memcheck and racecheck",
          r.seed);
      break;
    }
    if (r.passed()) {
      best.record.stage = "checked";
      db_.put(best.record);
      report.final_check =
          fmt::format("PASS (seed {}{})", r.seed, sanitize ? "; memcheck and racecheck clean" : "");
      break;
    }
    report.final_check = fmt::format("FAIL: {}", r.detail);
    best.record.verdict = r.verdict;
    best.record.stage = "final check";
    best.record.detail = r.detail;
    db_.put(best.record);
    pick_best(report, default_point);
  }

  report.wall_seconds = seconds_since(start);
  nlohmann::json summary = report.to_json(5);
  summary.erase("evaluations");
  db_.finish_tune(tune_id, summary);
  return report;
}

TuneReport Tuner::replay(const std::vector<const KernelFile*>& files, const TuneProblem& problem,
                         const std::string& device, const TuneOptions& options,
                         const TuneProgressFn& progress) {
  const auto start = Clock::now();
  const auto info = db_.find_device(device);
  if (!info) {
    throw UsageError(
        fmt::format("the results database {} has no device '{}'", db_.path().string(), device));
  }
  TuneReport report;
  report.replay = true;
  const SearchSpace space = solve_into(report, files, problem, options, *info);
  report.device = device;  // as recorded, even if the key's format changes
  const std::string arch = options.arch.empty() ? info->default_arch() : options.arch;
  ReplayEvaluator evaluator(space, problem, device, arch, db_, report);
  search_with_baseline(space, evaluator, options, report, progress, start);
  if (report.best) {
    const auto& stage = report.evaluations[*report.best].record.stage;
    report.final_check = stage == "checked" ? "PASS (recorded)" : "not checked (replay)";
  }
  report.wall_seconds = seconds_since(start);
  return report;
}

nlohmann::json TuneReport::to_json(size_t top) const {
  const auto evaluation_json = [&](const TuneEvaluation& e) {
    const auto& r = e.record;
    nlohmann::json j = {{"variant", r.variant},
                        {"variant_key", r.variant_key},
                        {"params", r.params},
                        {"verdict", verdict_name(r.verdict)},
                        {"stage", r.stage},
                        {"detail", r.detail},
                        {"registers", r.registers},
                        {"spill_bytes", r.spill_bytes},
                        {"from_database", e.from_database}};
    if (r.occupancy >= 0) j["occupancy"] = r.occupancy;
    if (r.timed()) {
      j["time_us"] = {{"median", r.stats.median * 1e3},
                      {"p10", r.stats.p10 * 1e3},
                      {"p90", r.stats.p90 * 1e3},
                      {"rel_noise", r.stats.rel_noise},
                      {"samples", r.stats.count}};
    }
    return j;
  };
  const std::vector<size_t> order = ranked();
  nlohmann::json top_json = nlohmann::json::array();
  for (size_t i = 0; i < std::min(top, order.size()); ++i)
    top_json.push_back(evaluation_json(evaluations[order[i]]));
  nlohmann::json all = nlohmann::json::array();
  for (const auto& e : evaluations)
    all.push_back(evaluation_json(e));
  return {
      {"problem", problem.key()},
      {"device", device},
      {"strategy", strategy},
      {"seed", seed},
      {"replay", replay},
      {"space",
       {{"raw", raw_size},
        {"feasible", feasible},
        {"estimated", estimate_samples > 0},
        {"estimate_samples", estimate_samples},
        {"solve_ms", solve_seconds * 1e3},
        {"pruned_before_compile", pruned_before_compile}}},
      {"rejected_after_compile", rejected_after_compile},
      {"failed", failed},
      {"evaluated", evaluations.size()},
      {"valid", order.size()},
      {"from_database", from_database_count()},
      {"missing_in_replay", missing_in_replay},
      {"stop_reason", stop_reason},
      {"starts_used", starts_used},
      {"starts_skipped", starts_skipped},
      {"compile",
       {{"compiled", compiled},
        {"jobs", compile_jobs},
        {"busy_seconds", compile_busy_seconds},
        {"variants_per_second", compile_throughput()},
        {"seconds_per_variant", compile_seconds_per_variant()},
        {"capacity_variants_per_second", compile_capacity()},
        {"compile_seconds_sum", compile_seconds_sum}}},
      {"device_wait_seconds", device_wait_seconds},
      {"wall_seconds", wall_seconds},
      {"best", best ? evaluation_json(evaluations[*best]) : nlohmann::json()},
      {"baseline", baseline ? evaluation_json(evaluations[*baseline]) : nlohmann::json()},
      {"speedup_vs_baseline", best && baseline && evaluations[*baseline].record.timed()
                                  ? nlohmann::json(evaluations[*baseline].record.stats.median /
                                                   evaluations[*best].record.stats.median)
                                  : nlohmann::json()},
      {"final_check", final_check},
      {"top", top_json},
      {"evaluations", all},
  };
}

}  // namespace kforge
