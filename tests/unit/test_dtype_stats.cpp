#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "bench/statistics.h"
#include "check/compare.h"
#include "core/dtype.h"
#include "core/random.h"

namespace kforge {
namespace {

double round_trip(DType dtype, double v) {
  std::byte buf[8];
  store_element(buf, dtype, 0, v);
  return load_element(buf, dtype, 0);
}

TEST(DType, RoundToNearestEven) {
  EXPECT_EQ(round_trip(DType::f16, 1.0), 1.0);
  EXPECT_EQ(round_trip(DType::f16, 65504.0), 65504.0);
  EXPECT_TRUE(std::isinf(round_trip(DType::f16, 65520.0)));  // halfway to the next: inf
  EXPECT_EQ(round_trip(DType::f16, 65519.0), 65504.0);
  EXPECT_EQ(round_trip(DType::f16, 1.0 + 0x1p-11), 1.0);  // tie goes to even
  EXPECT_EQ(round_trip(DType::f16, 1.0 + 3 * 0x1p-11), 1.0 + 0x1p-9);
  EXPECT_EQ(round_trip(DType::f16, 0x1p-24), 0x1p-24);  // smallest subnormal
  EXPECT_EQ(round_trip(DType::f16, 0x1p-26), 0.0);
  EXPECT_EQ(round_trip(DType::bf16, 1.0 + 0x1p-8), 1.0);  // tie to even
  EXPECT_EQ(round_trip(DType::bf16, 1.0 + 3 * 0x1p-8), 1.0 + 0x1p-6);
  EXPECT_EQ(round_trip(DType::bf16, -3.0), -3.0);
  EXPECT_TRUE(std::isnan(round_trip(DType::bf16, NAN)));
  EXPECT_TRUE(std::isnan(round_trip(DType::f16, NAN)));
}

TEST(DType, NanFillIsNan) {
  for (const DType d : {DType::f16, DType::bf16, DType::f32, DType::f64}) {
    std::vector<std::byte> buf(4 * dtype_size(d));
    fill_nan(buf.data(), d, 4);
    for (size_t i = 0; i < 4; ++i)
      EXPECT_TRUE(std::isnan(load_element(buf.data(), d, i)));
  }
}

TEST(Random, StreamsAreReproducibleAndDistinct) {
  Rng a(42, 1), b(42, 1), c(42, 2);
  for (int i = 0; i < 100; ++i) {
    const uint64_t va = a.next();
    EXPECT_EQ(va, b.next());
    EXPECT_NE(va, c.next());
  }
  Rng n(7, 0);
  double sum = 0, sum_sq = 0;
  const int count = 200000;
  for (int i = 0; i < count; ++i) {
    const double z = n.normal();
    sum += z;
    sum_sq += z * z;
  }
  EXPECT_NEAR(sum / count, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / count, 1.0, 0.02);
}

TEST(Statistics, Summary) {
  const std::vector<double> v = {5, 1, 4, 2, 3};
  const SampleStats s = summarize(v);
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.median, 3);
  EXPECT_DOUBLE_EQ(s.mean, 3);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 5);
  EXPECT_DOUBLE_EQ(s.p10, 1.4);
  EXPECT_DOUBLE_EQ(s.p90, 4.6);
  EXPECT_NEAR(s.rel_noise, 1.4826 * 1 / 3, 1e-12);  // MAD of {2,1,0,1,2} is 1
}

TEST(Statistics, RobustNoiseIgnoresOneOutlier) {
  std::vector<double> v(99, 10.0);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] += 0.01 * static_cast<double>(i % 3);
  v.push_back(1000.0);
  const SampleStats s = summarize(v);
  EXPECT_NEAR(s.median, 10.01, 1e-9);
  EXPECT_LT(s.rel_noise, 0.002);
}

TEST(Statistics, StoppingRule) {
  StoppingRule rule;
  rule.min_samples = 10;
  rule.min_seconds = 0;
  rule.max_seconds = 100;
  rule.target_rel_stderr = 0.01;
  std::string reason;
  std::vector<double> quiet(10, 1.0);
  EXPECT_TRUE(rule.should_stop(quiet, 0.1, &reason));
  EXPECT_NE(reason.find("median known"), std::string::npos);
  std::vector<double> few(5, 1.0);
  EXPECT_FALSE(rule.should_stop(few, 0.1, &reason));
  // Noisy samples: keep going until the cap.
  Rng rng(3, 0);
  std::vector<double> noisy;
  for (int i = 0; i < 20; ++i)
    noisy.push_back(1.0 + 0.5 * rng.uniform());
  EXPECT_FALSE(rule.should_stop(noisy, 1.0, &reason));
  EXPECT_TRUE(rule.should_stop(noisy, 100.0, &reason));
  EXPECT_NE(reason.find("time cap"), std::string::npos);
}

SampleStats stats(double median, double noise, size_t n) {
  SampleStats s;
  s.median = median;
  s.count = n;
  s.rel_noise = noise;
  s.rel_stderr = 1.2533 * noise / std::sqrt(static_cast<double>(n));
  return s;
}

TEST(Statistics, CompareFromSpreads) {
  EXPECT_EQ(compare_timings(stats(100, 0.005, 400), stats(90, 0.005, 400)), Comparison::faster);
  EXPECT_EQ(compare_timings(stats(100, 0.005, 400), stats(110, 0.005, 400)), Comparison::slower);
  EXPECT_EQ(compare_timings(stats(100, 0.005, 400), stats(100.2, 0.005, 400)), Comparison::same);
  // 3% apart but each run has 20% noise over 10 samples: cannot tell.
  EXPECT_EQ(compare_timings(stats(100, 0.2, 10), stats(97, 0.2, 10)), Comparison::unclear);
}

SampleStats stats(double median, double noise, size_t n, double min) {
  SampleStats s = stats(median, noise, n);
  s.min = min;
  return s;
}

TEST(Statistics, AbaNeedsTheGainInMediansAndInFastestSamples) {
  // A clear gain: medians and fastest samples both 20% down.
  const AbaComparison gain = compare_aba(stats(100, 0.005, 400, 98), stats(80, 0.005, 400, 78.5),
                                         stats(101, 0.005, 400, 99), 0.01);
  EXPECT_TRUE(gain.faster);
  EXPECT_NEAR(gain.median_gain, 1.25, 1e-9);
  // The same code timed between two timings of itself that a busy host slowed: medians and
  // noise as in a CPU record (5234 and 5572 us at 5-6% noise against a quiet 4090 +- 0.35%), the
  // fastest samples of the best as a host that is only busy at times leaves them. Both medians'
  // comparisons say FASTER; the fastest samples do not.
  const AbaComparison slowed_best =
      compare_aba(stats(5233.9, 0.0489, 5, 4100), stats(4089.6, 0.0035, 6, 4071.6),
                  stats(5572.3, 0.0605, 5, 4150), 0.01);
  EXPECT_EQ(slowed_best.before, Comparison::faster);
  EXPECT_EQ(slowed_best.after, Comparison::faster);
  EXPECT_LT(slowed_best.fastest_gain, 1.01);
  EXPECT_FALSE(slowed_best.faster);
  // Faster than the first timing of the baseline only.
  EXPECT_FALSE(compare_aba(stats(100, 0.005, 400, 98), stats(90, 0.005, 400, 88),
                           stats(90.5, 0.005, 400, 88), 0.01)
                   .faster);
}

TEST(Compare, ToleranceNanAndUnwritten) {
  std::vector<std::byte> buf(4 * 4);
  HostTensor t{"y", DType::f32, {2, 2}, buf.data()};
  const std::vector<double> expected = {1.0, 2.0, INFINITY, 4.0};
  store_element(buf.data(), DType::f32, 0, 1.0 + 1e-6);
  store_element(buf.data(), DType::f32, 1, 2.0);
  store_element(buf.data(), DType::f32, 2, INFINITY);
  fill_nan(buf.data() + 12, DType::f32, 1);  // the last element was never written
  CompareResult r = compare_output(t, expected, {1e-5, 1e-5});
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.mismatches, 1);
  EXPECT_EQ(r.nan_where_finite, 1);
  ASSERT_EQ(r.first.size(), 1u);
  EXPECT_EQ(r.first[0].coords, (std::vector<int64_t>{1, 1}));
  store_element(buf.data(), DType::f32, 3, 4.00001);
  r = compare_output(t, expected, {1e-5, 1e-5});
  EXPECT_TRUE(r.pass) << r.summary();
  store_element(buf.data(), DType::f32, 2, -INFINITY);  // wrong infinity
  EXPECT_FALSE(compare_output(t, expected, {1e-5, 1e-5}).pass);
}

}  // namespace
}  // namespace kforge

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "run/shared_region.h"

namespace kforge {
namespace {

TEST(SharedRegion, RemovesRegionsOfDeadProcessesOnly) {
  // A child creates a region and exits without unlinking it, as a killed kforge would.
  const pid_t child = fork();
  if (child == 0) {
    const std::string name = "/kforge-" + std::to_string(getpid()) + "-0-stale";
    const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    _exit(fd >= 0 ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  const std::string stale = "/kforge-" + std::to_string(child) + "-0-stale";
  const SharedRegion live = SharedRegion::create(64);  // ours: must survive

  SharedRegion::remove_stale();
  EXPECT_LT(shm_open(stale.c_str(), O_RDWR, 0600), 0);
  const int fd = shm_open(live.name().c_str(), O_RDWR, 0600);
  EXPECT_GE(fd, 0);
  if (fd >= 0) close(fd);
}

}  // namespace
}  // namespace kforge
