// The CUDA adversarial kernels (tests/data/adversarial/*.cu) through kforge check, bench and
// tune on the GPU, at sizes taken from their op's spec: each gets the verdict its file names and
// never wins a tune, and kforge survives every one of them. Skips without a GPU.
#include <cuda_runtime.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "adversarial.h"
#include "device/backend.h"
#include "ops/op_spec.h"

namespace kforge {
namespace {

// Bench at the op's headline size; tune at the largest sweep size with at most a third of the
// headline's bytes, so that a tune's many runs stay short (rmsnorm: 8192x8192 and 4096x4096).
std::pair<std::string, std::string> bench_and_tune_shapes(const std::string& op_name) {
  const OpSpec* op = find_op(op_name);
  if (!op) throw std::runtime_error("no op spec named " + op_name);
  const Sizes headline = op->default_size();
  const double budget = op->cost(headline, DType::bf16).bytes / 3;
  std::optional<Sizes> tune;
  double tune_bytes = 0;
  for (const SizeCase& c : op->bench_sizes()) {
    const double bytes = op->cost(c.sizes, DType::bf16).bytes;
    if (bytes <= budget && bytes > tune_bytes) {
      tune = c.sizes;
      tune_bytes = bytes;
    }
  }
  if (!tune) throw std::runtime_error(op_name + " has no sweep size below its headline");
  return {op->format_shape(headline), op->format_shape(*tune)};
}

class AdversarialGpu : public ::testing::TestWithParam<std::filesystem::path> {};

TEST_P(AdversarialGpu, GetsItsVerdictAndKforgeSurvives) {
  if (list_cuda_devices().empty()) GTEST_SKIP() << "no CUDA device";
  test::AdversarialRun run;
  run.file = GetParam();
  std::tie(run.bench_shape, run.tune_shape) = bench_and_tune_shapes(KernelFile::load(run.file).op);
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
// read x from L2. Each adversarial file times against itself with the policy off. A run judged
// `verdict` (other than OK: caught by a check after its samples were taken) still reports the
// median of its timed samples.
double bench_median_us(const std::string& file, const std::string& params,
                       const std::string& shape = "4096x1024", const std::string& verdict = "OK") {
  const auto json = test::temp_dir("l2-policy") / "bench.json";
  std::vector<std::string> args = {
      test::kforge_binary(), "bench",      file, "--shape", shape,         "--dtype", "bf16",
      "--no-baseline",       "--max-time", "2",  "--json",  json.string(), "--param"};
  std::stringstream list(params);
  for (std::string p; std::getline(list, p, ' ');)
    args.push_back(p);
  std::filesystem::remove(json);
  const CommandResult r = run_command(args, std::chrono::minutes(5));
  EXPECT_EQ(r.exit_code, verdict == "OK" ? 0 : 1) << r.output;
  if (!std::filesystem::exists(json)) return 0.0;
  const auto j = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(j.at("verdict"), verdict) << r.output;
  const double median = j.at("integrity").at("timed").at("median_us").get<double>();
  std::printf("%s %s at %s: %.2f us (%s)\n", file.c_str(), params.c_str(), shape.c_str(), median,
              j.at("verdict").get<std::string>().c_str());
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

// private_table_copy.cu reads RoPE's tables, which are not redrawn between samples, from a copy
// in memory it allocated itself, loaded evict_last. kforge knows no address in that memory, so
// only a step that covers every address (the reset of persisting lines) reaches those lines. At
// 1x1x32768x128 the tables are a third of the call's traffic. On an H100 the evict_last copy ran
// at 0.90 of the plain time with kforge's reset taken out, 0.98-0.99 with it. The control reads
// the same copy with plain loads, so the policy is judged alone against it. Both copies are made
// by the call before the timed ones, so the trap (entries of each table copied from other rows)
// finds them stale: WRONG, though their samples were timed.
TEST(L2Policy, PrivateCopyGainsNothing) {
  if (list_cuda_devices().empty()) GTEST_SKIP() << "no CUDA device";
  const std::string file = test::test_data_dir() + "/adversarial/private_table_copy.cu";
  const std::string shape = "1x1x32768x128";
  const double plain = bench_median_us(file, "PRIVATE_COPY=0", shape);
  const double control = bench_median_us(file, "PRIVATE_COPY=2", shape, "WRONG");
  const double kept = bench_median_us(file, "PRIVATE_COPY=1", shape, "WRONG");
  EXPECT_GT(kept, 0.95 * plain) << "the private copy's evict_last lines outlasted the flush";
  EXPECT_GT(kept, 0.97 * control) << "evict_last loads of the copy beat plain loads of it";
}

}  // namespace
}  // namespace kforge
