#include "check/compare.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/parallel.h"

namespace kforge {

namespace {

// Compares elements [begin, end) into `r` (counts, maxima, first mismatches in index order).
void compare_range(const HostTensor& got, std::span<const double> expected, Tolerance tolerance,
                   std::span<const double> magnitude, size_t max_reported, int64_t begin,
                   int64_t end, CompareResult& r) {
  r.checked = end - begin;
  for (int64_t i = begin; i < end; ++i) {
    const double g = load_element(got.data, got.dtype, static_cast<size_t>(i));
    const double e = expected[static_cast<size_t>(i)];
    bool ok;
    if (std::isfinite(e)) {
      if (std::isnan(g)) ++r.nan_where_finite;
      const double err = std::abs(g - e);
      const double scale = magnitude.empty()
                               ? std::abs(e)
                               : std::max(std::abs(e), magnitude[static_cast<size_t>(i)]);
      ok = std::isfinite(g) && err <= tolerance.atol + tolerance.rtol * scale;
      if (std::isfinite(g)) {
        r.max_abs_error = std::max(r.max_abs_error, err);
        if (std::abs(e) > tolerance.atol)
          r.max_rel_error = std::max(r.max_rel_error, err / std::abs(e));
      }
    } else {
      ok = std::isnan(e) ? std::isnan(g) : g == e;
    }
    if (!ok) {
      ++r.mismatches;
      if (r.first.size() < max_reported) {
        Mismatch m{i, {}, g, e};
        int64_t rest = i;
        m.coords.resize(got.shape.size());
        for (int d = static_cast<int>(got.shape.size()) - 1; d >= 0; --d) {
          m.coords[d] = rest % got.shape[d];
          rest /= got.shape[d];
        }
        r.first.push_back(std::move(m));
      }
    }
  }
}

}  // namespace

CompareResult compare_output(const HostTensor& got, std::span<const double> expected,
                             Tolerance tolerance, std::span<const double> magnitude,
                             size_t max_reported) {
  // Fixed-size chunks on all cores, merged in index order: large outputs (the tuner's gate
  // compares 67M elements per candidate) take a fraction of the single-thread time, and the
  // result does not depend on the thread count.
  constexpr int64_t kChunk = int64_t{1} << 20;
  const int64_t n = got.numel();
  const int64_t chunks = std::max<int64_t>(1, (n + kChunk - 1) / kChunk);
  std::vector<CompareResult> parts(static_cast<size_t>(chunks));
  parallel_for(chunks, [&](int64_t c) {
    compare_range(got, expected, tolerance, magnitude, max_reported, c * kChunk,
                  std::min(n, (c + 1) * kChunk), parts[static_cast<size_t>(c)]);
  });
  CompareResult r;
  for (auto& part : parts) {
    r.checked += part.checked;
    r.mismatches += part.mismatches;
    r.nan_where_finite += part.nan_where_finite;
    r.max_abs_error = std::max(r.max_abs_error, part.max_abs_error);
    r.max_rel_error = std::max(r.max_rel_error, part.max_rel_error);
    for (auto& m : part.first) {
      if (r.first.size() < max_reported) r.first.push_back(std::move(m));
    }
  }
  r.pass = r.mismatches == 0;
  return r;
}

std::string CompareResult::summary() const {
  std::string s =
      fmt::format("max abs err {:.3g}, max rel err {:.3g}", max_abs_error, max_rel_error);
  if (!pass) {
    s += fmt::format("; {} of {} elements out of tolerance", mismatches, checked);
    if (nan_where_finite > 0)
      s += fmt::format(" ({} NaN where the reference is finite)", nan_where_finite);
    for (const auto& m : first) {
      s += fmt::format("\n      at [{}]: got {:.6g}, expected {:.6g}", fmt::join(m.coords, ", "),
                       m.got, m.expected);
    }
  }
  return s;
}

nlohmann::json CompareResult::to_json() const {
  nlohmann::json mismatch_list = nlohmann::json::array();
  for (const auto& m : first) {
    mismatch_list.push_back({{"index", m.coords}, {"got", m.got}, {"expected", m.expected}});
  }
  return {{"pass", pass},
          {"checked", checked},
          {"mismatches", mismatches},
          {"nan_where_finite", nan_where_finite},
          {"max_abs_error", max_abs_error},
          {"max_rel_error", max_rel_error},
          {"first_mismatches", mismatch_list}};
}

}  // namespace kforge
