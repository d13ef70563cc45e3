// The CPU adversarial kernels (tests/data/adversarial/*.cpp) through kforge check, bench and
// tune on the CPU backend: each gets the verdict its file names, never wins a tune, and kforge
// survives every one of them with no process of a candidate left behind.
#include <tuple>
#include <utility>

#include "adversarial.h"

namespace kforge {
namespace {

class AdversarialCpu : public ::testing::TestWithParam<std::filesystem::path> {};

// Shapes the CPU backend times in well under a second, for the ops of the CPU files.
std::pair<std::string, std::string> bench_and_tune_shapes(const std::string& op) {
  if (op == "rotary_embedding") return {"1x8x256x64", "1x4x128x64"};
  return {"512x512", "256x256"};
}

TEST_P(AdversarialCpu, GetsItsVerdictAndKforgeSurvives) {
  test::AdversarialRun run;
  run.file = GetParam();
  run.check_args = {"--max-elements", "4194304"};
  std::tie(run.bench_shape, run.tune_shape) = bench_and_tune_shapes(KernelFile::load(run.file).op);
  run.device_args = {"--backend", "cpu"};
  run.tune_args = {"--strategy", "exhaustive"};
  test::run_adversarial(run);
}

// Every adversarial file, the GPU's too, names what kforge must say of it (the GPU runs find a
// missing line only on a GPU machine).
TEST(AdversarialFiles, EachNamesItsExpectedVerdicts) {
  for (const std::string extension : {".cpp", ".cu"}) {
    const auto files = test::adversarial_files(extension);
    EXPECT_FALSE(files.empty()) << extension;
    for (const auto& file : files) {
      const test::Expectation expect = test::read_expectation(file);
      EXPECT_FALSE(expect.check.empty()) << file;
      EXPECT_FALSE(expect.bench.empty()) << file;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Files, AdversarialCpu,
                         ::testing::ValuesIn(test::adversarial_files(".cpp")),
                         [](const auto& info) { return info.param.stem().string(); });

}  // namespace
}  // namespace kforge
