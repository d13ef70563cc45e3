#include "bench/statistics.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <fmt/format.h>

namespace kforge {
namespace {

// Linear interpolation between closest ranks of a sorted vector.
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const auto hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] * (1 - frac) + sorted[hi] * frac;
}

}  // namespace

SampleStats summarize(std::span<const double> samples) {
  SampleStats s;
  s.count = samples.size();
  if (samples.empty()) return s;
  std::vector<double> sorted(samples.begin(), samples.end());
  std::sort(sorted.begin(), sorted.end());
  s.median = quantile(sorted, 0.5);
  s.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(s.count);
  s.min = sorted.front();
  s.max = sorted.back();
  s.p10 = quantile(sorted, 0.1);
  s.p90 = quantile(sorted, 0.9);
  std::vector<double> deviations;
  deviations.reserve(sorted.size());
  for (const double v : sorted)
    deviations.push_back(std::abs(v - s.median));
  std::sort(deviations.begin(), deviations.end());
  const double mad = quantile(deviations, 0.5);
  s.rel_noise = s.median > 0 ? 1.4826 * mad / s.median : 0;
  s.rel_stderr = 1.2533 * s.rel_noise / std::sqrt(static_cast<double>(s.count));
  return s;
}

bool StoppingRule::should_stop(std::span<const double> samples, double elapsed_seconds,
                               std::string* reason) const {
  if (samples.size() >= max_samples) {
    *reason = fmt::format("reached {} samples", max_samples);
    return true;
  }
  if (elapsed_seconds >= max_seconds) {
    *reason = fmt::format("time cap {:.1f} s", max_seconds);
    return true;
  }
  if (samples.size() < min_samples || elapsed_seconds < min_seconds) return false;
  const SampleStats s = summarize(samples);
  if (s.rel_stderr <= target_rel_stderr) {
    *reason = fmt::format("median known to {:.2f}%", 100 * s.rel_stderr);
    return true;
  }
  return false;
}

std::string_view comparison_name(Comparison c) {
  switch (c) {
    case Comparison::same:
      return "SAME";
    case Comparison::faster:
      return "FASTER";
    case Comparison::slower:
      return "SLOWER";
    case Comparison::unclear:
      return "UNCLEAR";
  }
  return "?";
}

Comparison compare_timings(const SampleStats& baseline, const SampleStats& candidate,
                           double same_threshold) {
  if (baseline.median <= 0 || candidate.median <= 0) return Comparison::unclear;
  const double change = (candidate.median - baseline.median) / baseline.median;
  // Uncertainty of the difference: two standard errors of each median, combined, plus half of
  // the noise spread, so that run-to-run drift is not mistaken for a change.
  const double uncertainty =
      2.0 * std::hypot(baseline.rel_stderr, candidate.rel_stderr) +
      0.5 * std::max(baseline.rel_noise, candidate.rel_noise) / std::sqrt(2.0);
  if (std::abs(change) <= uncertainty) {
    return uncertainty <= same_threshold ? Comparison::same : Comparison::unclear;
  }
  if (std::abs(change) <= same_threshold) return Comparison::same;
  return change < 0 ? Comparison::faster : Comparison::slower;
}

AbaComparison compare_aba(const SampleStats& before, const SampleStats& candidate,
                          const SampleStats& after, double min_gain) {
  AbaComparison c;
  c.before = compare_timings(before, candidate, min_gain);
  c.after = compare_timings(after, candidate, min_gain);
  if (candidate.median <= 0 || candidate.min <= 0) return c;
  c.median_gain = std::min(before.median, after.median) / candidate.median;
  c.fastest_gain = std::min(before.min, after.min) / candidate.min;
  c.faster = c.before == Comparison::faster && c.after == Comparison::faster &&
             c.fastest_gain > 1 + min_gain;
  return c;
}

}  // namespace kforge
