// The CUDA adversarial kernels (tests/data/adversarial/*.cu) through kforge check, bench and
// tune on the GPU, at the sizes the cheats were first seen at: each gets the verdict its file
// names and never wins a tune, and kforge survives every one of them. Skips without a GPU.
#include <cuda_runtime.h>
#include "adversarial.h"

#include "device/backend.h"

namespace kforge {
namespace {

class AdversarialGpu : public ::testing::TestWithParam<std::filesystem::path> {};

TEST_P(AdversarialGpu, GetsItsVerdictAndKforgeSurvives) {
  if (list_cuda_devices().empty()) GTEST_SKIP() << "no CUDA device";
  test::AdversarialRun run;
  run.file = GetParam();
  const KernelFile kernel = KernelFile::load(run.file);
  const bool matmul = kernel.op == "matmul";
  run.bench_shape = matmul ? "4096x4096x4096" : "8192x8192";
  run.tune_shape = matmul ? "1024x1024x1024" : "4096x4096";
  // Local search starts a climber in every file, round robin: the adversarial file's one
  // variant is among the first few evaluated.
  run.tune_args = {"--strategy", "local", "--budget", "8"};
  test::run_adversarial(run);
}

INSTANTIATE_TEST_SUITE_P(Files, AdversarialGpu, ::testing::ValuesIn(test::adversarial_files(".cu")),
                         [](const auto& info) { return info.param.stem().string(); });

}  // namespace
}  // namespace kforge

namespace kforge {
namespace {

// Kernels whose faults the five stages cannot see pass them, and fail the sanitizer stage with
// the tool that saw the fault named.
struct SanitizerCase {
  const char* file;
  const char* tool;
};

class SanitizerStage : public ::testing::TestWithParam<SanitizerCase> {};

TEST_P(SanitizerStage, FindsWhatTheStagesMiss) {
  if (list_cuda_devices().empty()) GTEST_SKIP() << "no CUDA device";
  ::setenv("KFORGE_CACHE_DIR", test::shared_module_cache().c_str(), 1);
  const std::string file = test::test_data_dir() + "/faulty/" + GetParam().file;
  const CommandResult plain = run_command({test::kforge_binary(), "check", file, "--dtype", "bf16"},
                                          std::chrono::minutes(5));
  EXPECT_EQ(test::printed_verdict(plain.output), "OK") << plain.output;
  const CommandResult sanitized =
      run_command({test::kforge_binary(), "check", file, "--dtype", "bf16", "--sanitize"},
                  std::chrono::minutes(10));
  EXPECT_EQ(test::printed_verdict(sanitized.output), "WRONG") << sanitized.output;
  EXPECT_NE(sanitized.output.find(std::string("sanitize / ") + GetParam().tool), std::string::npos)
      << sanitized.output;
}

INSTANTIATE_TEST_SUITE_P(Faults, SanitizerStage,
                         ::testing::Values(SanitizerCase{"racy_but_right.cu", "racecheck"},
                                           SanitizerCase{"uninit_read.cu", "initcheck"}),
                         [](const auto& info) { return std::string(info.param.tool); });

}  // namespace
}  // namespace kforge

namespace kforge {
namespace {

// An L2 policy buys a kernel nothing between timed samples. At 4096x1024 in bf16, x (8 MB) and y
// fit in L2 with room to spare: were x's lines left in place by the flush, every sample would
// read x from L2. Each adversarial file times against itself with the policy off.
double bench_median_us(const std::string& file, const std::string& params) {
  const auto json = test::temp_dir("l2-policy") / "bench.json";
  std::vector<std::string> args = {
      test::kforge_binary(), "bench",      file, "--shape", "4096x1024",   "--dtype", "bf16",
      "--no-baseline",       "--max-time", "2",  "--json",  json.string(), "--param"};
  std::stringstream list(params);
  for (std::string p; std::getline(list, p, ' ');)
    args.push_back(p);
  const CommandResult r = run_command(args, std::chrono::minutes(5));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0 || !std::filesystem::exists(json)) return 0.0;
  const auto j = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(j.at("verdict"), "OK") << r.output;
  const double median = j.at("time_us").at("median").get<double>();
  std::printf("%s %s at 4096x1024: %.2f us\n", file.c_str(), params.c_str(), median);
  return median;
}

// evict_last_x.cu loads x evict_last: lines so marked outlast any amount of normal writes, so
// the flush reaches them only because kforge demotes them first.
TEST(L2Policy, EvictLastGainsNothing) {
  if (list_cuda_devices().empty()) GTEST_SKIP() << "no CUDA device";
  const std::string file = test::test_data_dir() + "/adversarial/evict_last_x.cu";
  const double plain = bench_median_us(file, "X_EVICT_LAST=0");
  const double kept = bench_median_us(file, "X_EVICT_LAST=1");
  EXPECT_GT(kept, 0.9 * plain) << "x's evict_last lines outlasted the flush";
}

// persists_x_in_l2.cu marks x persisting in whatever L2 the device set aside on its own (skipped
// where there is none: the window would not be used).
TEST(L2Policy, PersistingWindowGainsNothing) {
  if (list_cuda_devices().empty()) GTEST_SKIP() << "no CUDA device";
  size_t set_aside = 0;
  if (cudaDeviceGetLimit(&set_aside, cudaLimitPersistingL2CacheSize) != cudaSuccess ||
      set_aside == 0) {
    GTEST_SKIP() << "this device sets no L2 aside for persisting lines: the window has no effect";
  }
  const std::string file = test::test_data_dir() + "/adversarial/persists_x_in_l2.cu";
  const double plain = bench_median_us(file, "SET_ASIDE=0 WINDOW=0");
  const double kept = bench_median_us(file, "SET_ASIDE=0 WINDOW=1");
  EXPECT_GT(kept, 0.9 * plain) << "x's persisting lines outlasted the flush";
}

}  // namespace
}  // namespace kforge
