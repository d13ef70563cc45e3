// Element-wise comparison of a kernel's output with the float64 reference:
// |got - expected| <= atol + rtol * |expected|. A NaN where the reference is finite (which is
// what an unwritten, NaN-poisoned element looks like) always fails; a non-finite reference must
// be matched exactly (same infinity, or NaN).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/op_spec.h"

namespace kforge {

struct Mismatch {
  int64_t index = 0;
  std::vector<int64_t> coords;
  double got = 0;
  double expected = 0;
};

struct CompareResult {
  bool pass = true;
  int64_t checked = 0;
  int64_t mismatches = 0;
  int64_t nan_where_finite = 0;  // includes elements the kernel never wrote
  double max_abs_error = 0;      // over finite pairs
  double max_rel_error = 0;      // |got - expected| / |expected|, where |expected| > atol
  std::vector<Mismatch> first;   // first few mismatches, in index order

  std::string summary() const;
  nlohmann::json to_json() const;
};

// `magnitude`, when not empty, replaces |expected| in the relative term where it is larger.
CompareResult compare_output(const HostTensor& got, std::span<const double> expected,
                             Tolerance tolerance, std::span<const double> magnitude = {},
                             size_t max_reported = 5);

}  // namespace kforge
