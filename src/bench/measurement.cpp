#include "bench/measurement.h"

#include <algorithm>
#include <random>

#include <fmt/format.h>

#include "bench/limits.h"
#include "core/error.h"

namespace kforge {
namespace {

constexpr size_t kShownOutputBytes = 8192;

struct SampleRow {
  size_t index = 0;
  std::string kind;  // timed, repeat, trap
  double ms = 0;
  bool throttled = false;
  uint64_t digest = 0;
  int64_t poisoned = 0;
};

std::vector<SampleRow> parse_samples(const nlohmann::json& reply) {
  std::vector<SampleRow> rows;
  for (const auto& s : reply.at("samples")) {
    rows.push_back({s.at("index").get<size_t>(), s.at("kind").get<std::string>(),
                    s.at("ms").get<double>(), s.at("throttled").get<bool>(),
                    s.at("digest").get<uint64_t>(), s.at("poisoned").get<int64_t>()});
  }
  return rows;
}

std::vector<FreshInput> fresh_rules(const OpSpec& op, const Sizes& sizes) {
  std::vector<FreshInput> rules;
  for (size_t i = 0; i < op.inputs().size(); ++i)
    rules.push_back(op.fresh_input(i, sizes));
  return rules;
}

std::string describe_guards(const nlohmann::json& violations) {
  const auto& g = violations.front();
  return fmt::format("wrote outside tensor '{}' ({} byte {})", g.at("tensor").get<std::string>(),
                     g.at("where").get<std::string>(), g.at("byte_offset").get<long long>());
}

uint64_t unpredictable_seed() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

// The samples checked after the fact, with why each was picked: the ones the result is made of
// (fastest, median), every trap, and `random_checks` more.
std::vector<std::pair<const SampleRow*, std::string>> samples_to_check(
    const std::vector<SampleRow>& rows, int random_checks) {
  std::vector<const SampleRow*> timed;
  for (const auto& r : rows) {
    if (r.kind == "timed" && !r.throttled) timed.push_back(&r);
  }
  std::vector<std::pair<const SampleRow*, std::string>> picked;
  const auto add = [&](const SampleRow* row, std::string why) {
    for (const auto& p : picked) {
      if (p.first == row) return;
    }
    picked.emplace_back(row, std::move(why));
  };
  if (!timed.empty()) {
    std::vector<const SampleRow*> by_time = timed;
    std::sort(by_time.begin(), by_time.end(),
              [](const SampleRow* a, const SampleRow* b) { return a->ms < b->ms; });
    add(by_time.front(), "the fastest");
    add(by_time[(by_time.size() - 1) / 2], "the median");
  }
  for (const auto& r : rows) {
    if (r.kind == "trap") add(&r, "a trap: a few inputs changed since the sample before");
  }
  std::random_device rd;
  for (int i = 0; i < random_checks && !timed.empty(); ++i) {
    add(timed[rd() % timed.size()], "drawn at random");
  }
  return picked;
}

// Runs sample `index` again in the worker and checks it: the same outputs as when it was timed,
// inputs unchanged, every output within tolerance of the reference. Returns the failure, or "".
std::string check_sample(Checker& checker, WorkerClient& worker, const OpSpec& op,
                         const Sizes& sizes, DType dtype, CaseTensors& tensors,
                         const SampleRow& sample, const std::string& why, Verdict* verdict,
                         std::string* passed, std::string* output,
                         std::chrono::milliseconds timeout) {
  const std::string name = fmt::format("timed sample {} ({})", sample.index, why);
  const WorkerReply reply = worker.request({{"op", "replay"}, {"index", sample.index}}, timeout);
  *output += reply.output;
  if (!reply.ok()) {
    *verdict = reply.verdict;
    return fmt::format("{}, run again: {}", name, reply.detail);
  }
  *verdict = Verdict::wrong;
  const auto& body = reply.body;
  if (!body.at("guard_violations").empty()) {
    return fmt::format("{}: {}", name, describe_guards(body.at("guard_violations")));
  }
  if (body.at("inputs_changed").get<bool>()) return fmt::format("{}: modified its inputs", name);
  if (body.at("digest").get<uint64_t>() != sample.digest) {
    return fmt::format(
        "{}: run again on the same inputs, it gives different outputs than when it was timed "
        "(results kept from another call, or not deterministic)",
        name);
  }
  const std::vector<double> scalars = op.scalar_values(sizes);
  const auto expected = checker.reference_outputs(op, sizes, tensors, scalars);
  if (expected.empty()) {
    *verdict = Verdict::ok;
    *passed = fmt::format("{}: same outputs as when timed; no reference at this size here", name);
    return "";
  }
  const CompareResult c = compare_outputs(op, dtype, tensors, expected);
  if (!c.pass) return fmt::format("{}: {}", name, c.summary());
  *verdict = Verdict::ok;
  *passed = fmt::format("{}: matches the reference", name);
  return "";
}

}  // namespace

nlohmann::json Measurement::to_json() const {
  const auto stats_json = [](const SampleStats& s) {
    return nlohmann::json{{"median_us", s.median * 1e3},
                          {"p10_us", s.p10 * 1e3},
                          {"p90_us", s.p90 * 1e3},
                          {"rel_noise", s.rel_noise},
                          {"samples", s.count}};
  };
  return {{"verdict", verdict_name(verdict)},
          {"detail", detail},
          {"samples_taken", samples_taken},
          {"probes", probes},
          {"timed", stats_json(stats)},
          {"repeats", stats_json(repeat_stats)},
          {"checks", checks},
          {"output", output}};
}

Measurement measure(Checker& checker, WorkerClient& worker, const OpSpec& op, const Sizes& sizes,
                    DType dtype, const TimedTarget& target, const Ceilings* ceilings,
                    const MeasureOptions& options, CaseTensors* given_tensors) {
  Measurement m;
  std::optional<CaseTensors> own_tensors;
  if (!given_tensors) {
    own_tensors.emplace(op, sizes, dtype);
    own_tensors->generate_inputs(InputKind::normal, unpredictable_seed());
  }
  CaseTensors& tensors = given_tensors ? *given_tensors : *own_tensors;
  const auto timeout =
      options.timeout.count() > 0 ? options.timeout : default_timeout(op, sizes, dtype);
  const auto fail = [&](Verdict v, std::string detail) {
    m.verdict = v;
    m.detail = std::move(detail);
    m.output = truncate_middle(m.output, kShownOutputBytes);
    return m;
  };

  tensors.poison_outputs();
  nlohmann::json request = tensors.request(
      "measure", target.library ? std::filesystem::path() : target.module, op.scalar_values(sizes));
  if (target.library) {
    request["library"] = op.name();
  }
  request["sizes"] = sizes;
  request["settings"] = options.settings;
  request["fresh"] = fresh_rules(op, sizes);
  request["seed"] = unpredictable_seed();
  request["repeats"] = options.repeats;
  request["traps"] = options.traps;
  const auto limit =
      timeout + std::chrono::milliseconds(static_cast<long long>(
                    1000 * (options.settings.max_seconds + options.settings.warmup_seconds) * 4));
  const WorkerReply reply = worker.request(request, limit);
  m.output = reply.output;
  if (!reply.ok()) return fail(reply.verdict, reply.detail);
  const nlohmann::json& body = reply.body;
  m.throttled_samples = body.at("throttled_samples");
  m.clock_monitored = body.at("clock_monitored");
  m.sm_clock_mhz = body.value("sm_clock_mhz_median", 0);
  m.warmup_runs = body.at("warmup_runs");
  m.stop_reason = body.at("stop_reason");
  m.library = body.value("baseline", "");
  const std::vector<SampleRow> rows = parse_samples(body);
  m.samples_taken = rows.size();
  if (!body.at("guard_violations").empty()) {
    return fail(Verdict::wrong, "while timed: " + describe_guards(body.at("guard_violations")));
  }
  std::vector<double> timed_ms, repeat_ms;
  for (const auto& r : rows) {
    if (r.poisoned > 0) {
      return fail(Verdict::wrong,
                  fmt::format("timed sample {} ({}) left {} output elements unwritten", r.index,
                              r.kind, r.poisoned));
    }
    if (r.kind != "timed") ++m.probes;
    if (r.throttled) continue;
    if (r.kind == "timed") timed_ms.push_back(r.ms);
    if (r.kind == "repeat") repeat_ms.push_back(r.ms);
  }
  m.stats = summarize(timed_ms);
  m.repeat_stats = summarize(repeat_ms);
  if (m.stats.count == 0) return fail(Verdict::ok, "");

  // Reused work: faster on inputs it has seen than on fresh ones, on every repeat. A sample's
  // time is its cost plus whatever the machine added: on a shared host a CPU kernel's samples
  // fall into modes up to several times apart (its cost, or its cost while a neighbour holds
  // the core's other thread or its slice), which can change from one sample to the next, so a
  // repeat or two may land in a faster mode than every fresh sample by chance. Noise only adds
  // time, so the fastest fresh sample measures the cost (and it is checked after the fact, so
  // it cannot be made fast by skipping work); a kernel that reuses work is well below it on
  // every repeat, even the slowest. One repeat alone (a measurement cut short by its time cap
  // before the others) is no evidence either way.
  if (m.repeat_stats.count >= 2 && m.repeat_stats.max < kReuseRatio * m.stats.min) {
    return fail(Verdict::invalid,
                fmt::format("reuses work across calls: on every repeat of the previous call's "
                            "inputs it took at most {:.2f} us (the slowest of {}), on fresh "
                            "inputs at least {:.2f} us (the fastest of {}; median {:.2f} us)",
                            m.repeat_stats.max * 1e3, m.repeat_stats.count, m.stats.min * 1e3,
                            m.stats.count, m.stats.median * 1e3));
  }
  if (ceilings) {
    if (auto why = physical_limit_violation(op.cost(sizes, dtype), m.stats.median * 1e-3, *ceilings,
                                            worker.device().l2_bytes)) {
      return fail(Verdict::invalid, *why);
    }
  }

  if (options.verify) {
    // A checked sample's inputs come back into `tensors`, a trap's with the kept inputs it
    // changed: they are put back, so that the next measurement on these tensors (a tune's next
    // candidate) starts from the op's own.
    const auto kept = tensors.kept_inputs();
    struct PutBack {
      CaseTensors& tensors;
      const std::vector<std::vector<std::byte>>& kept;
      ~PutBack() { tensors.restore_kept_inputs(kept); }
    } put_back{tensors, kept};
    for (const auto& [row, why] : samples_to_check(rows, options.random_checks)) {
      Verdict v = Verdict::ok;
      std::string passed;
      const std::string failure = check_sample(checker, worker, op, sizes, dtype, tensors, *row,
                                               why, &v, &passed, &m.output, timeout);
      if (!failure.empty()) return fail(v, failure);
      m.checks.push_back(passed);
    }
  }
  m.output = truncate_middle(m.output, kShownOutputBytes);
  return m;
}

}  // namespace kforge
