// GPU tests of `kforge export` (CTest label `gpu`): the standalone export of every op with a table
// for this GPU built with CMake and its example run; the torch package built and checked by
// tests/gpu/torch_export_check.py (ops against their composites, fallbacks counted,
// torch.compile, no backward, CUDA graphs, dispatch overhead). Skipped where no CUDA device is
// visible; the torch test also where PyTorch does not import.
#include <chrono>
#include <iostream>
#include <string>

#include <gtest/gtest.h>

#include "core/process.h"
#include "device/backend.h"
#include "test_support.h"

namespace kforge {
namespace {

class ExportGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (list_cuda_devices().empty()) GTEST_SKIP() << "no CUDA device";
  }

  // `kforge export all --target TARGET` for this GPU into a fresh directory.
  std::filesystem::path export_all(const std::string& target) {
    const auto out = test::temp_dir("export-gpu-" + target) / "export";
    const CommandResult r = run_command(
        {test::kforge_binary(), "export", "all", "--target", target, "--out", out.string()},
        std::chrono::minutes(20));
    EXPECT_TRUE(r.ok()) << r.output;
    return out;
  }
};

TEST_F(ExportGpuTest, StandaloneExampleRunsEveryOp) {
  const auto out = export_all("standalone");
  const auto build = out.parent_path() / "build";
  const CommandResult configure =
      run_command({"cmake", "-S", out.string(), "-B", build.string(), "-G", "Ninja"});
  ASSERT_TRUE(configure.ok()) << configure.output;
  const CommandResult compiled =
      run_command({"cmake", "--build", build.string()}, std::chrono::minutes(20));
  ASSERT_TRUE(compiled.ok()) << compiled.output;
  const CommandResult ran = run_command({(build / "kforge_export_example").string()});
  EXPECT_TRUE(ran.ok()) << ran.output;
  EXPECT_NE(ran.output.find("all ops ran"), std::string::npos) << ran.output;
  std::cout << ran.output;
}

TEST_F(ExportGpuTest, TorchPackagePassesItsChecks) {
  if (!run_command({"python3", "-c", "import torch; assert torch.cuda.is_available()"},
                   std::chrono::minutes(2))
           .ok())
    GTEST_SKIP() << "python3 cannot import torch with CUDA";
  const auto out = export_all("torch");
  const CommandResult r = run_command(
      {"python3", (test::source_root() / "tests" / "gpu" / "torch_export_check.py").string(),
       out.string()},
      std::chrono::minutes(20));
  EXPECT_TRUE(r.ok()) << r.output;
  std::cout << r.output;

  // The example llama, unmodified, run under `kforge patch`: its RMSNorms, RoPE and loss are
  // swapped at its first forward, and every call is counted (on kforge where this GPU's table
  // has the example's sizes, else fallen back with the reason).
  const CommandResult patched = run_command(
      {test::kforge_binary(), "patch", "--export", out.string(), "--", "python3",
       (test::source_root() / "python" / "examples" / "llama.py").string(), "--iters", "2"},
      std::chrono::minutes(10));
  EXPECT_TRUE(patched.ok()) << patched.output;
  for (const char* line :
       {"RMSNorm -> kforge::rmsnorm", "RotaryEmbeddingHalf -> kforge::rotary_embedding_half",
        "CrossEntropyLoss -> kforge::cross_entropy", "calls rmsnorm:"})
    EXPECT_NE(patched.output.find(line), std::string::npos) << line << "\n" << patched.output;
  std::cout << patched.output;
}

}  // namespace
}  // namespace kforge
