// Checks the planner tests share: finding a plan row, and that a plan counts every kernel once.
#pragma once

#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "profile/planner.h"

namespace kforge::test {

inline const PlanGroup& row(const Plan& plan, const std::string& op, const std::string& shape) {
  for (const auto& g : plan.groups) {
    if (g.op == op && g.shape == shape) return g;
  }
  throw Error("no row " + op + " " + shape);
}

// Every kernel in exactly one group: kernel counts and times add up to the profile's.
inline void expect_each_kernel_counted_once(const Profile& profile, const Plan& plan) {
  int64_t kernels = 0, time = 0;
  double share = 0;
  for (const auto& g : plan.groups) {
    kernels += g.kernels;
    time += g.time_ns;
    share += g.share;
    int64_t named = 0;
    for (const auto& n : g.kernel_names)
      named += n.kernels;
    EXPECT_EQ(named, g.kernels) << g.op << " " << g.shape;
  }
  EXPECT_EQ(kernels, static_cast<int64_t>(profile.kernels.size()));
  EXPECT_EQ(time, profile.kernel_time_ns());
  EXPECT_NEAR(share, 1.0, 1e-12);
}

}  // namespace kforge::test
