// Summary statistics of timing samples, the stopping rule that decides when enough samples were
// taken, and the comparison of two results from their spreads (never from two medians alone).
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace kforge {

struct SampleStats {
  size_t count = 0;
  double median = 0;
  double mean = 0;
  double min = 0;
  double max = 0;
  double p10 = 0;
  double p90 = 0;
  // Robust relative noise: 1.4826 * MAD / median (equals stddev/mean for normal samples).
  double rel_noise = 0;
  // Relative standard error of the median: 1.2533 * rel_noise / sqrt(count).
  double rel_stderr = 0;
};

SampleStats summarize(std::span<const double> samples);

struct StoppingRule {
  size_t min_samples = 20;
  size_t max_samples = 5000;
  double min_seconds = 0.05;         // keep sampling at least this long
  double max_seconds = 3.0;          // wall-clock cap
  double target_rel_stderr = 0.002;  // stop once the median is known to 0.2%

  // Returns true with `reason` set once sampling should stop.
  bool should_stop(std::span<const double> samples, double elapsed_seconds,
                   std::string* reason) const;
};

enum class Comparison { same, faster, slower, unclear };
std::string_view comparison_name(Comparison c);

// Is `candidate` faster than `baseline` (both in time units)? SAME when the medians differ by
// less than their combined uncertainty and that uncertainty is small; UNCLEAR when the
// uncertainty is too large to tell.
Comparison compare_timings(const SampleStats& baseline, const SampleStats& candidate,
                           double same_threshold = 0.01);

// A candidate timed between two timings of the baseline (A B A), judged against both.
struct AbaComparison {
  Comparison before = Comparison::unclear;  // compare_timings(before, candidate)
  Comparison after = Comparison::unclear;   // compare_timings(after, candidate)
  double median_gain = 0;                   // the faster baseline median / the candidate's
  double fastest_gain = 0;                  // the faster baseline minimum / the candidate's
  bool faster = false;                      // faster than both, in medians and in minima
};

// Interference (a neighbour on the host, a clock dip) only ever adds time. A candidate that is
// really faster is faster in its fastest samples too, while a baseline slowed on both sides of
// the candidate can pass the medians' test alone. So `faster` needs both medians' comparisons
// FASTER and the candidate's minimum below the lower baseline minimum by more than `min_gain`.
AbaComparison compare_aba(const SampleStats& before, const SampleStats& candidate,
                          const SampleStats& after, double min_gain);

}  // namespace kforge
