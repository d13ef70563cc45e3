#include "run/timed_samples.h"

#include <algorithm>
#include <chrono>
#include <map>

#include <fmt/format.h>

#include "bench/statistics.h"
#include "core/error.h"
#include "core/random.h"

namespace kforge {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

const char* kind_name(SampleKind kind) {
  switch (kind) {
    case SampleKind::timed:
      return "timed";
    case SampleKind::repeat:
      return "repeat";
    case SampleKind::trap:
      return "trap";
  }
  return "?";
}

// Positions of the probes among the first samples: never the first two, never next to each
// other, so each probe follows a plain timed sample whose inputs it reuses; and within the first
// 2 + 3 per probe (and `min_samples`), so that a measurement its time cap cuts short still
// takes them all (the reuse check judges only two repeats or more).
std::map<size_t, SampleKind> probe_positions(const ProbePlan& plan, size_t min_samples, Rng& rng) {
  const size_t window = std::min(min_samples, size_t(2 + 3 * (plan.repeats + plan.traps)));
  std::vector<size_t> candidates;
  for (size_t i = 2; i < window; ++i)
    candidates.push_back(i);
  for (size_t i = candidates.size(); i > 1; --i)
    std::swap(candidates[i - 1], candidates[rng.next() % i]);
  std::map<size_t, SampleKind> picked;
  const auto free_at = [&](size_t p) {
    return !picked.contains(p) && !picked.contains(p - 1) && !picked.contains(p + 1);
  };
  int repeats = plan.repeats, traps = plan.traps;
  for (const size_t p : candidates) {
    if (repeats == 0 && traps == 0) break;
    if (!free_at(p)) continue;
    picked[p] = traps > 0 ? SampleKind::trap : SampleKind::repeat;
    (traps > 0 ? traps : repeats) -= 1;
  }
  return picked;
}

}  // namespace

std::unique_ptr<RepeatableCall> make_steady_repeatable(DeviceBackend& backend,
                                                       const std::function<void()>& call,
                                                       std::span<const DeviceSpan> outputs) {
  call();
  backend.synchronize();
  return backend.make_repeatable(call, outputs);
}

TimedSession::TimedSession(DeviceBackend& backend, std::unique_ptr<DeviceTensors> tensors,
                           std::function<void()> call, std::vector<FreshInput> fresh)
    : backend_(backend),
      tensors_(std::move(tensors)),
      call_(std::move(call)),
      fresh_(std::move(fresh)),
      inputs_(tensors_->spans(false)),
      outputs_(tensors_->spans(true)),
      buffers_(tensors_->all_spans()),
      kept_backups_(back_up_kept_inputs()),
      repeatable_(make_steady_repeatable(backend_, call_, outputs_)) {}

std::vector<TimedSession::DeviceCopy> TimedSession::back_up_kept_inputs() {
  std::vector<DeviceCopy> backups;
  for (size_t t = 0; t < inputs_.size(); ++t) {
    backups.emplace_back(nullptr, Release{&backend_});
    if (fresh::trap_rows(fresh_.at(t), inputs_[t].count) == 0) continue;
    backups.back().reset(backend_.allocate(inputs_[t].bytes()));
    backend_.copy_on_device(backups.back().get(), inputs_[t].data, inputs_[t].bytes());
  }
  return backups;
}

uint64_t TimedSession::inputs_seed(size_t index) const {
  return fresh::mix(seed_ ^ fresh::mix(index + 1));
}

// The same changes as CaseTensors::apply_trap makes on the host, so that a replayed trap is
// judged against the reference of the inputs the kernel saw.
void TimedSession::prepare_inputs(const Sample& sample) {
  if (kept_changed_) {
    for (size_t t = 0; t < inputs_.size(); ++t) {
      if (kept_backups_[t]) {
        backend_.copy_on_device(inputs_[t].data, kept_backups_[t].get(), inputs_[t].bytes());
      }
    }
    kept_changed_ = false;
  }
  const uint64_t seed = inputs_seed(sample.inputs_from);
  for (size_t t = 0; t < inputs_.size(); ++t) {
    backend_.fill_fresh(inputs_[t], 0, inputs_[t].count, fresh_.at(t), fresh::mix(seed + t));
  }
  if (sample.kind != SampleKind::trap) return;
  if (!inputs_.empty() && inputs_[0].count > 0) {
    for (int j = 0; j < fresh::kTrapElements; ++j) {
      const int64_t e = fresh::trap_element(sample.trap_seed, j, inputs_[0].count);
      backend_.fill_fresh(inputs_[0], e, e + 1, fresh_.at(0), fresh::mix(sample.trap_seed + 1));
    }
  }
  for (size_t t = 0; t < inputs_.size(); ++t) {
    if (!kept_backups_[t]) continue;
    const int64_t rows = fresh::trap_rows(fresh_.at(t), inputs_[t].count);
    const size_t elem = dtype_size(inputs_[t].dtype);
    auto* base = static_cast<std::byte*>(inputs_[t].data);
    for (int j = 0; j < fresh::kTrapElements; ++j) {
      const fresh::TrapEntry e =
          fresh::trap_entry(sample.trap_seed, j, rows, fresh_.at(t).row_length);
      backend_.copy_on_device(base + e.to * elem, base + e.from * elem, elem);
    }
    kept_changed_ = true;
  }
}

double TimedSession::launch_timed() {
  for (const auto& o : outputs_)
    backend_.poison(o);
  return backend_.time_once([this] { repeatable_->launch(); }, cold_cache_, buffers_);
}

double TimedSession::take(const Sample& sample) {
  prepare_inputs(sample);
  return launch_timed();
}

nlohmann::json TimedSession::measure(const BenchSettings& settings, uint64_t seed,
                                     const ProbePlan& probes) {
  seed_ = seed;
  cold_cache_ = settings.cold_cache;
  samples_.clear();
  Rng rng(seed, 0x70726f6265);
  const std::map<size_t, SampleKind> positions = probe_positions(probes, settings.min_samples, rng);

  // Warm-up: module load, first-launch costs and clock ramp-up stay out of the samples. Its
  // inputs come from seeds past any sample's.
  const auto warm_start = Clock::now();
  size_t warmup_runs = 0;
  while (warmup_runs < 3 || seconds_since(warm_start) < settings.warmup_seconds) {
    Sample warm;
    warm.inputs_from = (size_t{1} << 40) + warmup_runs;
    take(warm);
    ++warmup_runs;
  }

  StoppingRule rule{settings.min_samples, settings.max_samples, settings.min_seconds,
                    settings.max_seconds, settings.target_rel_stderr};
  std::vector<double> kept;  // plain timed samples, not throttled: what the result is made of
  size_t throttled = 0;
  bool clock_monitored = false;
  std::vector<int> clocks;
  std::string reason;
  nlohmann::json records = nlohmann::json::array();
  const auto start = Clock::now();
  for (size_t i = 0;; ++i) {
    Sample s;
    s.inputs_from = i;
    if (const auto it = positions.find(i); it != positions.end()) {
      s.kind = it->second;
      s.inputs_from = i - 1;
      if (s.kind == SampleKind::trap)
        s.trap_seed = fresh::mix(seed ^ fresh::mix(0x74726170ull + i));
    }
    samples_.push_back(s);
    const double ms = take(s);
    const ClockReading clock = backend_.read_clock();
    const Digest d = backend_.digest(outputs_);
    clock_monitored = clock_monitored || clock.available;
    if (clock.available) clocks.push_back(clock.sm_clock_mhz);
    // A throttled sample measures the cooling, not the kernel: it is kept out of the result.
    if (clock.throttled) ++throttled;
    if (s.kind == SampleKind::timed && !clock.throttled) kept.push_back(ms);
    records.push_back({{"index", i},
                       {"kind", kind_name(s.kind)},
                       {"ms", ms},
                       {"throttled", clock.throttled},
                       {"inputs_from", s.inputs_from},
                       {"digest", d.hash},
                       {"poisoned", d.poisoned}});
    if (d.poisoned > 0) {
      reason = fmt::format("sample {} left {} output elements unwritten", i, d.poisoned);
      break;
    }
    const double elapsed = seconds_since(start);
    if (rule.should_stop(kept, elapsed, &reason)) break;
    if (kept.empty() && elapsed > settings.max_seconds) {
      reason = "every sample was taken while throttled";
      break;
    }
  }
  backend_.check_nothing_left_running(std::chrono::seconds(2));
  nlohmann::json reply = {{"ok", true},
                          {"samples", records},
                          {"throttled_samples", throttled},
                          {"clock_monitored", clock_monitored},
                          {"warmup_runs", warmup_runs},
                          {"stop_reason", reason},
                          {"guard_violations", tensors_->guard_violations()}};
  if (!clocks.empty()) {
    std::sort(clocks.begin(), clocks.end());
    reply["sm_clock_mhz_median"] = clocks[clocks.size() / 2];
  }
  return reply;
}

nlohmann::json TimedSession::replay(size_t index) {
  if (index >= samples_.size()) throw Error(fmt::format("no sample {} to replay", index));
  const Sample& s = samples_[index];
  // The inputs as the sample saw them go to kforge before the call, and must be unchanged after.
  prepare_inputs(s);
  const Digest inputs_before = backend_.digest(inputs_);
  tensors_->download(false);
  const double ms = launch_timed();
  const Digest d = backend_.digest(outputs_);
  const Digest inputs_after = backend_.digest(inputs_);
  backend_.check_nothing_left_running(std::chrono::seconds(2));
  tensors_->download(true);
  return {{"ok", true},
          {"index", index},
          {"ms", ms},
          {"digest", d.hash},
          {"poisoned", d.poisoned},
          {"inputs_changed", !(inputs_before == inputs_after)},
          {"guard_violations", tensors_->guard_violations()}};
}

}  // namespace kforge
