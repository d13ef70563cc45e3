// The CUDA adversarial kernels (tests/data/adversarial/*.cu) through kforge check, bench and
// tune on the GPU, at the sizes the cheats were first seen at: each gets the verdict its file
// names and never wins a tune, and kforge survives every one of them. Skips without a GPU.
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
