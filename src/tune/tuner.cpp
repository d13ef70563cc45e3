#include "tune/tuner.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
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

// The outcome of timing one variant on every lane at once (see calibrate_lanes).
struct Calibration {
  bool agree = true;
  nlohmann::json json;
};

// Evaluates on every lane of a device pool. Compiles run on a pool of CPU threads as points are
// submitted; each lane has a thread that takes the oldest compiled-or-compiling point off one
// queue, evaluates it on its device and commits the result to the database at once. next()
// hands results back in submission order, so the strategy sees the same sequence whatever the
// number of lanes, and a killed tune loses at most the evaluations in flight.
//
// An evaluation that ends its worker (CRASH, TIMEOUT) or fails outside the candidate is
// followed by a probe of its lane: a lane that cannot start a worker any more is dropped and the
// evaluation goes back to the queue; otherwise the evaluation runs once more (on whichever lane
// is free) and that verdict stands. A worker killed from outside therefore costs one repeat, and
// a candidate that crashes costs two evaluations, never a lost or a double record.
class LiveEvaluator final : public Evaluator {
 public:
  LiveEvaluator(const SearchSpace& space, const TuneProblem& problem, const TuneOptions& options,
                const std::string& arch, ResultsDb& db, const Compiler& compiler, DevicePool& pool,
                TuneReport& report)
      : space_(space),
        problem_(problem),
        options_(options),
        arch_(arch),
        db_(db),
        compiler_(compiler),
        pool_(pool),
        report_(report),
        device_key_(device_key(pool.device())),
        compile_slots_(options.compile_jobs ? options.compile_jobs
                                            : std::max(1u, std::thread::hardware_concurrency())),
        input_seed_(fresh_seed()) {
    for (DeviceLane* lane : pool.live_lanes())
      lanes_.push_back(std::make_unique<LaneState>(lane));
  }

  ~LiveEvaluator() override {
    stop();
    for (auto& job : order_) {
      if (job->build.valid()) job->build.wait();
    }
  }

  // Starts a thread per lane; call after calibrate().
  void start() {
    live_ = lanes_.size();
    for (auto& lane : lanes_)
      lane->thread = std::thread([this, state = lane.get()] { serve(*state); });
  }

  // Ends the lane threads (each after its evaluation in progress).
  void stop() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (auto& lane : lanes_) {
      if (lane->thread.joinable()) lane->thread.join();
    }
  }

  void submit(PointId point) override {
    auto job = std::make_shared<Job>();
    job->point = point;
    job->variant = variant_at(space_, point, problem_.dtype, arch_);
    if (options_.use_database) {
      const std::lock_guard lock(db_mutex_);
      job->known = db_.find(job->variant.key(), problem_.key(), device_key_);
      // Recorded by another timing method (older rules): not trusted, evaluated again.
      if (job->known && job->known->method != kMeasurementMethod) job->known.reset();
    }
    if (!job->known) {
      job->build = compile_async(point, job->variant);
      {
        const std::lock_guard lock(mutex_);
        queue_.push_back(job);
      }
      ready_.notify_all();
    }
    order_.push_back(std::move(job));
  }

  TuneEvaluation next() override {
    const std::shared_ptr<Job> job = std::move(order_.front());
    order_.pop_front();
    if (job->known) return {job->point, *job->known, true};
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return job->done || live_ == 0; });
    if (!job->done) pool_.first_live();  // throws: every device was lost, and why
    return {job->point, std::move(job->result), false};
  }

  // Times the variant at `point` on every lane at once, as the lanes will run during the tune.
  // They agree when the slowest median is within max(2%, 3 relative standard errors) of the
  // fastest; then every lane's timings rank together. Not run (agree) with one lane.
  Calibration calibrate(PointId point) {
    Calibration c;
    if (lanes_.size() < 2) return c;
    const Variant variant = variant_at(space_, point, problem_.dtype, arch_);
    const CompileResult build = compile_async(point, variant).get();
    std::vector<std::future<EvaluationRecord>> runs;
    for (auto& lane : lanes_) {
      runs.push_back(std::async(std::launch::async, [this, state = lane.get(), point, &build] {
        try {
          return evaluate(*state, point, build);
        } catch (const std::exception& e) {  // the lane failed: its thread will probe it
          EvaluationRecord r = new_record(problem_, device_key_, build.variant);
          r.verdict = Verdict::crash;
          r.stage = "device";
          r.detail = e.what();
          return r;
        }
      }));
    }
    double fastest = INFINITY, slowest = 0, stderr_max = 0;
    c.json = {{"variant", variant.describe()}, {"lanes", nlohmann::json::array()}};
    for (size_t i = 0; i < runs.size(); ++i) {
      const EvaluationRecord r = runs[i].get();
      nlohmann::json lane = {{"lane", lanes_[i]->lane->name}, {"verdict", verdict_name(r.verdict)}};
      if (r.timed()) {
        lane["median_us"] = r.stats.median * 1e3;
        fastest = std::min(fastest, r.stats.median);
        slowest = std::max(slowest, r.stats.median);
        stderr_max = std::max(stderr_max, r.stats.rel_stderr);
      } else {
        c.agree = false;  // nothing to compare: rank within one lane to be safe
        lane["detail"] = r.detail;
      }
      c.json["lanes"].push_back(lane);
    }
    const double tolerance = std::max(0.02, 3 * stderr_max);
    if (c.agree) {
      c.json["spread"] = slowest / fastest - 1;
      c.agree = slowest / fastest - 1 <= tolerance;
    }
    c.json["tolerance"] = tolerance;
    c.json["agree"] = c.agree;
    return c;
  }

  // Evaluates `point` again on `lane` alone (the lane threads stopped), for a ranking within
  // one device's timings.
  EvaluationRecord evaluate_on(DeviceLane& lane, PointId point) {
    LaneState* state = nullptr;
    for (auto& l : lanes_) {
      if (l->lane == &lane) state = l.get();
    }
    if (!state) throw Error(fmt::format("{} is not a lane of this tune", lane.name));
    const CompileResult build =
        compile_async(point, variant_at(space_, point, problem_.dtype, arch_)).get();
    EvaluationRecord r = evaluate(*state, point, build);
    const std::lock_guard lock(db_mutex_);
    db_.put(r);
    return r;
  }

  // Per lane: its name, evaluations, and whether it was lost and why.
  nlohmann::json lanes_json() const {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& l : lanes_) {
      out.push_back({{"lane", l->lane->name},
                     {"evaluations", l->evaluated},
                     {"lost", l->lane->lost},
                     {"lost_reason", l->lane->lost_reason}});
    }
    return out;
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
  struct Job {
    PointId point = 0;
    Variant variant;
    std::optional<EvaluationRecord> known;  // from the database: not evaluated again
    std::shared_future<CompileResult> build;
    int attempts = 0;  // evaluations that ended their worker
    bool done = false;
    EvaluationRecord result;
  };

  // A lane and what its evaluations reuse: the tuned problem's inputs and reference.
  struct LaneState {
    explicit LaneState(DeviceLane* l) : lane(l) {}
    DeviceLane* lane;
    std::thread thread;
    std::optional<CaseTensors> tensors;
    std::optional<CaseTensors> measured;
    std::vector<std::vector<double>> expected;
    size_t evaluated = 0;
  };

  static constexpr int kAttempts = 2;  // evaluations of a point whose worker ended

  std::shared_future<CompileResult> compile_async(PointId point, const Variant& variant) {
    const KernelFile* file = space_.files()[space_.point(point).file];
    return std::async(std::launch::async,
                      [this, file, variant] {
                        compile_slots_.acquire();
                        const auto start = Clock::now();
                        CompileResult r;
                        try {
                          r = compiler_.compile(*file, variant);
                        } catch (const std::exception& e) {
                          // Not built: the lane records why, as for a compiler error.
                          r.variant = variant;
                          r.log = e.what();
                        }
                        compile_slots_.release();
                        note_compile(start, r);
                        return r;
                      })
        .share();
  }

  // A lane's thread: evaluates queued points until stopped or lost.
  void serve(LaneState& lane) {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        job = queue_.front();
        queue_.pop_front();
      }
      const auto wait_start = Clock::now();
      const CompileResult& build = job->build.get();
      const double waited = seconds_since(wait_start);
      std::optional<EvaluationRecord> r;
      std::string failure;  // the lane failed, not the candidate
      try {
        r = evaluate(lane, job->point, build);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      const bool worker_ended =
          !r || r->verdict == Verdict::crash || r->verdict == Verdict::timeout;
      if (worker_ended && !pool_.probe(*lane.lane)) {
        {
          const std::lock_guard lock(mutex_);
          queue_.push_front(job);
          --live_;
        }
        ready_.notify_all();
        done_.notify_all();
        return;
      }
      if (worker_ended && ++job->attempts < kAttempts) {
        {
          const std::lock_guard lock(mutex_);
          queue_.push_front(job);
          ++report_.retried;
        }
        ready_.notify_all();
        continue;
      }
      if (!r) {
        r = new_record(problem_, device_key_, build.variant);
        r->verdict = Verdict::crash;
        r->stage = "device";
        r->detail = failure;
        r->ran_on = lane.lane->name;
      }
      {
        const std::lock_guard lock(db_mutex_);
        db_.put(*r);
      }
      {
        const std::lock_guard lock(mutex_);
        if (lane.evaluated > 0) report_.device_wait_seconds += waited;
        ++lane.evaluated;
        job->result = std::move(*r);
        job->done = true;
      }
      done_.notify_all();
    }
  }

  void note_compile(Clock::time_point start, const CompileResult& r) {
    std::lock_guard lock(compile_mutex_);
    if (r.from_cache) return;
    compile_intervals_.emplace_back(start, Clock::now());
    ++report_.compiled;
    report_.compile_seconds_sum += r.seconds;
  }

  // The tuned problem's inputs and reference on `lane`, made once for every candidate.
  CaseTensors& fixture(LaneState& lane) {
    if (!lane.tensors) {
      lane.tensors.emplace(*problem_.op, problem_.sizes, problem_.dtype);
      lane.tensors->generate_inputs(InputKind::normal, input_seed_);
    }
    return *lane.tensors;
  }

  EvaluationRecord evaluate(LaneState& lane, size_t point, const CompileResult& build) {
    const OpSpec& op = *problem_.op;
    Checker& checker = *lane.lane->checker;
    WorkerClient& worker = *lane.lane->worker;
    const KernelFile& file = *space_.files()[space_.point(point).file];
    EvaluationRecord r = new_record(problem_, device_key_, build.variant);
    r.method = kMeasurementMethod;
    r.ran_on = lane.lane->name;
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
            post_compile_rejection(build.resources, space_.launch_shape(point), worker.device(),
                                   file.min_occupancy_percent, &occupancy)) {
      return fail(Verdict::rejected, "resources", *why);
    }
    if (occupancy) r.occupancy = occupancy->fraction;

    const SizeCase smoke = op.test_sizes().front();
    const CaseResult s =
        checker.run_case(op, build, "smoke", smoke.label, smoke.sizes, InputKind::normal,
                         derive_seed(input_seed_, "smoke", point), 1.0,
                         default_timeout(op, smoke.sizes, problem_.dtype));
    if (s.verdict != Verdict::ok) return fail(s.verdict, "smoke", with_output(s.detail, s.output));

    const auto timeout = default_timeout(op, problem_.sizes, problem_.dtype);
    const CaseResult g = checker.run_prepared(
        op, build, fixture(lane), lane.expected,
        CaseResult{"gate", "tuned", problem_.sizes, problem_.dtype, InputKind::normal, input_seed_},
        1.0, timeout);
    if (g.verdict != Verdict::ok) return fail(g.verdict, "gate", with_output(g.detail, g.output));
    if (g.skipped) return fail(Verdict::rejected, "gate", g.detail);

    MeasureOptions measure_options;
    measure_options.settings = options_.bench;
    measure_options.random_checks = 0;  // the fastest, the median and the trap are checked
    measure_options.timeout = timeout;
    const Measurement m =
        measure(checker, worker, op, problem_.sizes, problem_.dtype, TimedTarget{build.module},
                options_.ceilings, measure_options, &measured_inputs(lane));
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
  CaseTensors& measured_inputs(LaneState& lane) {
    if (!lane.measured) {
      lane.measured.emplace(*problem_.op, problem_.sizes, problem_.dtype);
      lane.measured->generate_inputs(InputKind::normal, derive_seed(input_seed_, "measure", 0));
    }
    return *lane.measured;
  }

  const SearchSpace& space_;
  const TuneProblem& problem_;
  const TuneOptions& options_;
  std::string arch_;
  ResultsDb& db_;
  const Compiler& compiler_;
  DevicePool& pool_;
  TuneReport& report_;
  std::string device_key_;
  std::counting_semaphore<1024> compile_slots_;
  uint64_t input_seed_;
  std::vector<std::unique_ptr<LaneState>> lanes_;
  std::deque<std::shared_ptr<Job>> order_;  // submitted, not yet handed back (main thread)

  std::mutex mutex_;                        // guards what follows, and the report's device counters
  std::deque<std::shared_ptr<Job>> queue_;  // waiting for a lane, oldest first
  std::condition_variable ready_;           // the queue grew, or stopping
  std::condition_variable done_;            // a job finished, or a lane was lost
  size_t live_ = 0;                         // lane threads serving
  bool stopping_ = false;

  std::mutex db_mutex_;
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

// The lanes disagree: the best few are timed again on `lane`, and the winner is picked among
// those timings only (the others keep their lanes' times, marked by ran_on).
// The fastest timed evaluation among `indices`.
void pick_best_among(TuneReport& report, const std::vector<size_t>& indices) {
  report.best.reset();
  for (const size_t i : indices) {
    if (!report.evaluations[i].record.timed()) continue;
    if (!report.best ||
        report.evaluations[i].record.cost() < report.evaluations[*report.best].record.cost()) {
      report.best = i;
    }
  }
}

// The indices timed again.
std::vector<size_t> retime_best_on_one_lane(TuneReport& report, LiveEvaluator& evaluator,
                                            DeviceLane& lane,
                                            const std::function<void(const std::string&)>& say) {
  constexpr size_t kRetimed = 5;
  std::vector<size_t> top = report.ranked();
  if (top.size() > kRetimed) top.resize(kRetimed);
  if (say && !top.empty()) {
    say(fmt::format("the devices' timings disagree: timing the best {} again on {}", top.size(),
                    lane.name));
  }
  for (const size_t i : top) {
    report.evaluations[i].record = evaluator.evaluate_on(lane, report.evaluations[i].point);
    report.evaluations[i].from_database = false;
  }
  report.retimed = top.size();
  pick_best_among(report, top);
  return top;
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
  if (!compiler_ || !devices_) throw Error("a live tune needs a compiler and a device");
  const auto start = Clock::now();
  const OpSpec& op = *problem.op;
  const DeviceInfo& device = devices_->device();
  const bool cuda = device.backend == "cuda";
  if (!has_reference(op, problem.sizes, device.backend)) {
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
    // Here, not on a compile thread: a file whose headers are missing stops the tune at once.
    if (f->uses("cutlass")) compiler_->cutlass_include_dir(*f);
  }
  const std::string arch = options.arch.empty() ? device.default_arch() : options.arch;

  TuneReport report;
  const SearchSpace space = solve_into(report, files, problem, options, device);

  db_.put_device(device);
  std::vector<std::string> file_names;
  for (const KernelFile* f : files)
    file_names.push_back(f->path.string());
  std::vector<std::string> lane_names;
  for (const DeviceLane* lane : devices_->live_lanes())
    lane_names.push_back(lane->name);
  const int64_t tune_id = db_.begin_tune(problem.key(), report.device,
                                         {{"strategy", options.strategy},
                                          {"seed", report.seed},
                                          {"max_evaluations", options.max_evaluations},
                                          {"max_fraction", options.max_fraction},
                                          {"max_seconds", options.max_seconds},
                                          {"lookahead", options.lookahead},
                                          {"starts", options.starts.size()},
                                          {"files", file_names},
                                          {"devices", lane_names},
                                          {"git_sha", git_state().sha}});

  report.compile_jobs = options.compile_jobs ? options.compile_jobs
                                             : std::max(1u, std::thread::hardware_concurrency());
  LiveEvaluator evaluator(space, problem, options, arch, db_, *compiler_, *devices_, report);
  const auto default_point = space.size() ? space.default_point(0) : std::nullopt;
  Calibration calibration;
  if (devices_->live_lanes().size() > 1 && default_point) {
    if (say) say(fmt::format("calibrating {} devices", devices_->live_lanes().size()));
    calibration = evaluator.calibrate(*default_point);
    report.calibration = calibration.json;
  }
  evaluator.start();
  search_with_baseline(space, evaluator, options, report, progress, start);
  evaluator.stop();
  report.compile_busy_seconds = evaluator.compile_busy_seconds();
  std::vector<size_t> retimed;  // when the lanes disagree, the winner comes from these
  if (!calibration.agree)
    retimed = retime_best_on_one_lane(report, evaluator, devices_->first_live(), say);
  report.lanes = evaluator.lanes_json();

  // The winner must pass all five stages, and on a GPU the winner's sanitizers too; a failure
  // is recorded and the next best is tried. Without compute-sanitizer a CUDA winner passes the
  // five stages but is not recorded as checked.
  const bool sanitize = cuda && options.final_check;
  const bool sanitizer_found = !sanitize || find_compute_sanitizer().has_value();
  const std::string winner_tools = joined_tool_names(winner_sanitizer_tools());
  while (options.final_check && report.best) {
    TuneEvaluation& best = report.evaluations[*report.best];
    if (best.record.stage == "checked") {
      report.final_check = "PASS (recorded)";
      break;
    }
    // The final check runs the op's own sizes, whatever size is tuned: a variant that passed it
    // on this device for another size of the same op (a sweep's earlier size) has passed it.
    if (const auto elsewhere = db_.checked_at(
            best.record.variant_key, std::string(problem.op->name()), best.record.device)) {
      best.record.stage = "checked";
      db_.put(best.record);
      report.final_check = fmt::format("PASS (recorded at {})", *elsewhere);
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
                      check.sanitizer_tools.empty() ? "" : ", " + winner_tools));
    }
    const CheckReport r = devices_->first_live().checker->check(file, check, say);
    if (r.passed() && !sanitizer_found) {
      report.final_check = fmt::format(
          "PASS five stages (seed {}), but not recorded as checked: compute-sanitizer was not "
          "found for {}",
          r.seed, winner_tools);
      break;
    }
    if (r.passed()) {
      best.record.stage = "checked";
      db_.put(best.record);
      report.final_check =
          fmt::format("PASS (seed {}{})", r.seed,
                      check.sanitizer_tools.empty() ? "" : "; " + winner_tools + " clean");
      break;
    }
    report.final_check = fmt::format("FAIL: {}", r.detail);
    best.record.verdict = r.verdict;
    best.record.stage = "final check";
    best.record.detail = r.detail;
    db_.put(best.record);
    if (retimed.empty()) {
      pick_best(report, default_point);
    } else {
      pick_best_among(report, retimed);
    }
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
                        {"from_database", e.from_database},
                        {"ran_on", r.ran_on}};
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
      {"lanes", lanes},
      {"calibration", calibration},
      {"retried", retried},
      {"retimed", retimed},
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
