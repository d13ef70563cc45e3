// The search space at sizes that cannot be listed: 10^12 raw points counted exactly without
// being visited, counts estimated by sampling where a depth-first count would take too long,
// strategies that sample such a space lazily in bounded memory, the exhaustive strategy's
// limit, and a tune of a 10^12-variant file end to end on the CPU backend.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/random.h"
#include "device/launch_limits.h"
#include "test_support.h"
#include "tune/space.h"
#include "tune/strategy.h"

namespace kforge {
namespace {

constexpr uint64_t kTrillion = 1'000'000'000'000;

// A kernel header with tunables P1 .. P`count` of ten values each (0 .. 9), then `extra` lines.
std::string ten_value_tunables(int count) {
  std::string lines;
  for (int i = 1; i <= count; ++i)
    lines += fmt::format(" * param: P{} = 0 in {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}}\n", i);
  return lines;
}

KernelFile kernel(int tunables, const std::string& extra = "") {
  return KernelFile::parse("/* kforge\n * op: rmsnorm\n * backend: cpu\n * dtypes: bf16\n" +
                               ten_value_tunables(tunables) + extra + " */\nint body;\n",
                           "synthetic.cpp");
}

SearchSpace solve(const KernelFile& file) {
  const DeviceInfo device = cpu_device_info();
  const Sizes sizes = {{"M", 64}, {"N", 64}};
  return SearchSpace::solve({&file}, problem_bindings(device, DType::bf16, &sizes), device);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

long status_kb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

// How far the process's resident memory rose above its level at the start while `work` ran,
// in MB. The kernel's high-water mark is reset first (/proc/self/clear_refs), so what earlier
// tests used does not count; nullopt where it cannot be reset.
std::optional<double> peak_growth_mb(const std::function<void()>& work) {
  {
    std::ofstream reset("/proc/self/clear_refs");
    if (!(reset << "5" << std::flush)) {
      work();
      return std::nullopt;
    }
  }
  const long before = status_kb("VmRSS");
  work();
  const long peak = status_kb("VmHWM");
  if (before < 0 || peak < 0) return std::nullopt;
  return static_cast<double>(peak - before) / 1024.0;
}

// A cost with one optimum, from the point's digits: enough for local search and evolution to
// move.
double synthetic_cost(const SearchSpace& space, PointId p) {
  double cost = 1;
  for (const uint8_t c : space.point(p).choice)
    cost += std::abs(static_cast<double>(c) - 6.0);
  return cost;
}

TEST(SpaceAtScale, UnconstrainedTrillionIsCountedExactlyWithoutVisitingIt) {
  const KernelFile f = kernel(12);
  const SearchSpace space = solve(f);
  EXPECT_EQ(space.raw_size(), 1e12);
  EXPECT_EQ(space.size(), kTrillion);
  EXPECT_FALSE(space.counts_estimated());
  EXPECT_TRUE(space.pruned().empty());
  EXPECT_LT(space.solve_seconds(), 0.05);
  ASSERT_TRUE(space.ranked());
  EXPECT_EQ(space.nth(0), 0u);
  EXPECT_EQ(space.nth(kTrillion - 1), kTrillion - 1);

  // Ids are the digits of the point, the first tunable the most significant.
  const PointId id = 123'456'789'012;
  const SpacePoint p = space.point(id);
  EXPECT_EQ(p.choice, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2}));
  EXPECT_EQ(space.id_of(p), id);
  EXPECT_EQ(space.values(id).at("P4"), 4);
  EXPECT_EQ(*space.default_point(0), 0u);
  const std::vector<PointId> neighbors = space.neighbors(id);
  EXPECT_EQ(neighbors.size(), 12u * 9u);
  for (const PointId n : neighbors) {
    const SpacePoint q = space.point(n);
    int changed = 0;
    for (size_t i = 0; i < q.choice.size(); ++i)
      changed += q.choice[i] != p.choice[i];
    EXPECT_EQ(changed, 1);
  }
  EXPECT_THROW(space.enumerate(), UsageError);
}

TEST(SpaceAtScale, ConstraintsOnTheFirstTunablesAreCountedExactly) {
  // Both requirements bind within three tunables; below that, subtrees are counted whole.
  const KernelFile f = kernel(12,
                              " * require: P1 < P2\n"
                              " * require: P3 % 2 == 0\n");
  const SearchSpace space = solve(f);
  EXPECT_FALSE(space.counts_estimated());
  EXPECT_LT(space.solve_seconds(), 0.05);
  // P1 < P2 holds for 45 of the 100 pairs; P3 is even for half of the rest.
  EXPECT_EQ(space.pruned().at("require 'P1 < P2' (line 17)"), 55 * 1e10);
  EXPECT_EQ(space.pruned().at("require 'P3 % 2 == 0' (line 18)"), 45 * 5 * 1e9);
  EXPECT_EQ(space.size(), uint64_t{45} * 5 * 1'000'000'000);
  // Rank order is id order, and every rank is a feasible point.
  Rng rng(1, 2);
  PointId previous = 0;
  for (uint64_t rank = 0; rank < space.size(); rank += 1 + rng.next() % (space.size() / 50)) {
    const PointId id = space.nth(rank);
    EXPECT_TRUE(space.feasible(id));
    if (rank > 0) EXPECT_GT(id, previous);
    previous = id;
  }
}

TEST(SpaceAtScale, LateConstraintsAreEstimatedWithinAFewPercent) {
  // P11 and P12 are the last tunables: counting exactly would visit 10^11 nodes.
  const KernelFile f = kernel(12,
                              " * require: P11 % 2 == 0\n"
                              " * require: P1 + P12 <= 9\n");
  const auto start = std::chrono::steady_clock::now();
  const SearchSpace space = solve(f);
  EXPECT_LT(seconds_since(start), 10.0);
  ASSERT_TRUE(space.counts_estimated());
  EXPECT_FALSE(space.ranked());
  EXPECT_EQ(space.estimate_samples(), SearchSpace::kEstimateSamples);
  // The depth-first order blames P11 first: half the raw space. Of the rest, P1 + P12 <= 9
  // fails for 45 of the 100 (P1, P12) pairs.
  const double odd_p11 = 0.5e12;
  const double sum_over_nine = 0.5 * 0.45e12;
  const double feasible = 0.5 * 0.55e12;
  EXPECT_NEAR(space.pruned().at("require 'P11 % 2 == 0' (line 17)"), odd_p11, 0.03 * odd_p11);
  EXPECT_NEAR(space.pruned().at("require 'P1 + P12 <= 9' (line 18)"), sum_over_nine,
              0.03 * sum_over_nine);
  EXPECT_NEAR(static_cast<double>(space.size()), feasible, 0.03 * feasible);
  EXPECT_THROW(space.enumerate(), UsageError);

  // Sampling finds feasible points all the same, each once.
  auto random = make_strategy("random", space, 5);
  std::set<PointId> seen;
  for (int n = 0; n < 500; ++n) {
    const auto p = random->propose();
    ASSERT_TRUE(p.has_value());
    EXPECT_TRUE(space.feasible(*p));
    EXPECT_TRUE(seen.insert(*p).second) << "proposed twice";
    random->observe(*p, 1.0);
  }
}

TEST(SpaceAtScale, StrategiesSampleLazilyInBoundedMemory) {
  const KernelFile unconstrained = kernel(12);
  const KernelFile constrained = kernel(12,
                                        " * require: P1 < P2\n"
                                        " * require: P11 % 2 == 0\n");
  for (const KernelFile* file : {&unconstrained, &constrained}) {
    const SearchSpace space = solve(*file);
    for (const std::string name : {"random", "local", "evolution"}) {
      std::set<PointId> seen;
      double seconds = 0;
      const auto growth = peak_growth_mb([&] {
        const auto start = std::chrono::steady_clock::now();
        auto strategy = make_strategy(name, space, 11);
        for (int n = 0; n < 2000; ++n) {
          const auto p = strategy->propose();
          ASSERT_TRUE(p.has_value()) << name;
          ASSERT_TRUE(space.feasible(*p)) << name;
          ASSERT_TRUE(seen.insert(*p).second) << name << " proposed a point twice";
          strategy->observe(*p, synthetic_cost(space, *p));
        }
        seconds = seconds_since(start);
      });
      EXPECT_LT(seconds, 1.0) << name;
      if (growth) EXPECT_LT(*growth, 32.0) << name;
    }
  }
}

TEST(SpaceAtScale, StrategiesAreReproducibleFromTheSeed) {
  const KernelFile f = kernel(12, " * require: P12 != P1\n");
  const SearchSpace space = solve(f);
  ASSERT_TRUE(space.counts_estimated());
  for (const std::string name : {"random", "local", "evolution"}) {
    const auto path = [&](uint64_t seed) {
      auto strategy = make_strategy(name, space, seed);
      std::vector<PointId> out;
      for (int n = 0; n < 100; ++n) {
        const PointId p = *strategy->propose();
        strategy->observe(p, synthetic_cost(space, p));
        out.push_back(p);
      }
      return out;
    };
    EXPECT_EQ(path(3), path(3)) << name;
    EXPECT_NE(path(3), path(4)) << name;
  }
}

TEST(SpaceAtScale, ExhaustiveRefusesAboveItsLimit) {
  const KernelFile huge = kernel(12);
  const SearchSpace space = solve(huge);
  try {
    make_strategy("exhaustive", space, 1);
    FAIL() << "exhaustive accepted 10^12 points";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("at most 1000000"), std::string::npos) << message;
    EXPECT_NE(message.find("1000000000000 feasible variants"), std::string::npos) << message;
    EXPECT_NE(message.find("random, local or evolution"), std::string::npos) << message;
  }

  const KernelFile estimated_file = kernel(12, " * require: P12 != P1\n");
  const SearchSpace estimated = solve(estimated_file);
  try {
    make_strategy("exhaustive", estimated, 1);
    FAIL() << "exhaustive accepted an estimated space";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("about"), std::string::npos) << e.what();
  }

  // At the limit, it runs, in id order.
  const KernelFile million = kernel(6);
  const SearchSpace at_limit = solve(million);
  ASSERT_EQ(at_limit.size(), kExhaustiveLimit);
  auto exhaustive = make_strategy("exhaustive", at_limit, 1);
  for (PointId expected = 0; expected < 3; ++expected)
    EXPECT_EQ(*exhaustive->propose(), expected);
}

TEST(SpaceAtScale, RawSpaceBeyondSixtyFourBitsIsRefused) {
  const KernelFile f = kernel(20);  // 10^20 raw points
  try {
    solve(f);
    FAIL() << "a space of 10^20 raw points was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("64-bit"), std::string::npos) << e.what();
  }
}

// A correct RMSNorm for the CPU backend with twelve tunables that change nothing: 10^12
// variants of one kernel (the honest RMSNorm the adversarial CPU kernels build on).
std::string trillion_variant_rmsnorm() {
  const std::string honest = test::test_data_dir() + "/adversarial/honest_rmsnorm_cpu.h";
  return "/* kforge\n * op: rmsnorm\n * backend: cpu\n * dtypes: f16, bf16, f32\n" +
         ten_value_tunables(12) + " */\n#include \"" + honest +
         "\"\n\nKFORGE_ENTRY int kforge_run(const kf_args* args) { return honest_rmsnorm(args); "
         "}\n";
}

struct MeasuredRun {
  int exit_code = -1;  // -1: killed by a signal or the timeout
  double seconds = 0;
  double max_rss_mb = 0;  // the child's peak, or its largest waited-for descendant's
  std::string output;
};

// Runs a command with its output in a file and waits with wait4, for the child's resource use.
MeasuredRun run_measured(const std::vector<std::string>& argv, const std::filesystem::path& log,
                         std::chrono::seconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> args;
    for (const auto& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    if (!freopen(log.c_str(), "w", stdout)) _exit(126);
    dup2(STDOUT_FILENO, STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  MeasuredRun run;
  int status = 0;
  rusage usage{};
  while (wait4(pid, &status, WNOHANG, &usage) == 0) {
    if (std::chrono::steady_clock::now() - start > timeout) {
      kill(pid, SIGKILL);
      wait4(pid, &status, 0, &usage);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  run.seconds = seconds_since(start);
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  run.max_rss_mb = static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KB
  std::ifstream in(log);
  run.output.assign(std::istreambuf_iterator<char>(in), {});
  return run;
}

// The tune that once grew to tens of GB: random search over 10^12 variants with a budget of 2.
// Its peak memory is held against the same tune of the library's one-tunable CPU file (the
// process and its worker load the same libraries and buffers), and the report must show the
// space counted exactly.
TEST(TuneCli, TrillionVariantFileTunesInBoundedMemory) {
  const auto dir = test::temp_dir("trillion");
  ::setenv("KFORGE_CACHE_DIR", (dir / "cache").c_str(), 1);
  const auto huge = dir / "rmsnorm_trillion_cpu.cpp";
  std::ofstream(huge) << trillion_variant_rmsnorm();
  const auto tune = [&](const std::filesystem::path& file, const std::string& name) {
    return run_measured(
        {test::kforge_binary(), "tune", file.string(), "--strategy", "random", "--budget", "2",
         "--shape", "64x64", "--backend", "cpu", "--no-final-check", "--db",
         (dir / (name + ".sqlite")).string(), "--json", (dir / (name + ".json")).string()},
        dir / (name + ".log"), std::chrono::seconds(300));
  };
  const MeasuredRun small = tune(test::source_root() / "kernels/rmsnorm/rmsnorm_cpu.cpp", "small");
  ASSERT_EQ(small.exit_code, 0) << small.output;
  const MeasuredRun large = tune(huge, "huge");
  ASSERT_EQ(large.exit_code, 0) << large.output;
  EXPECT_LT(large.seconds, 60.0);
  EXPECT_LT(large.max_rss_mb, small.max_rss_mb + 64.0) << fmt::format(
      "peak {:.0f} MB for 10^12 variants, {:.0f} MB for 4", large.max_rss_mb, small.max_rss_mb);
  EXPECT_LT(large.max_rss_mb, 1024.0);

  const auto report = nlohmann::json::parse(std::ifstream(dir / "huge.json"));
  EXPECT_EQ(report.at("space").at("raw").get<double>(), 1e12);
  EXPECT_EQ(report.at("space").at("feasible").get<uint64_t>(), kTrillion);
  EXPECT_FALSE(report.at("space").at("estimated").get<bool>());
  EXPECT_LE(report.at("evaluated").get<int>(), 3);  // 2, and the defaults as the baseline
  EXPECT_FALSE(report.at("best").is_null());
  EXPECT_NE(large.output.find("1000000000000 raw combinations, 1000000000000 feasible"),
            std::string::npos)
      << large.output;
}

}  // namespace
}  // namespace kforge
