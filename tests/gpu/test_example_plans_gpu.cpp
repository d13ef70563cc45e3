// The example models profiled live and planned (CTest label `gpu`): `kforge profile` under NVTX
// shapes, then the planner, must find every op each model runs, at its shape, dtype and call
// count (example_model_rows.h), with whatever PyTorch and kernel libraries the machine has.
// Skipped where no CUDA device is visible or PyTorch does not import.
#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/process.h"
#include "device/backend.h"
#include "example_model_rows.h"
#include "profile/planner.h"
#include "test_support.h"

namespace kforge {
namespace {

class ExamplePlanGpuTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (list_cuda_devices().empty()) GTEST_SKIP() << "no CUDA device";
    if (!run_command({"python3", "-c", "import torch"}, std::chrono::minutes(2)).ok())
      GTEST_SKIP() << "python3 cannot import torch";
  }
};

// One warm-up and one timed step of a single-layer model, the timed one selected by its range.
Profile profile_one_step(const std::string& model) {
  const auto out = test::temp_dir("example-plan-" + model) / "p.json";
  const std::string script =
      (test::source_root() / "python" / "examples" / (model + ".py")).string();
  const CommandResult r = run_command(
      {test::kforge_binary(), "profile", "--range", "step", "--skip", "1", "--out", out.string(),
       "--", "python3", script, "--nvtx", "--layers", "1", "--iters", "1", "--warmup", "1"},
      std::chrono::minutes(5));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return read_profile(out);
}

TEST_P(ExamplePlanGpuTest, PlanFindsEveryOpOfTheModel) {
  const std::string model = GetParam();
  const Profile p = profile_one_step(model);
  ASSERT_FALSE(p.kernels.empty());
  PlanOptions options;  // the rows do not depend on the ceilings
  options.copy_gbps = 1000;
  options.matmul_tflops = 500;
  const Plan plan = make_plan(p, options);
  const std::vector<test::RowKey> expected = model == "llama"  ? test::llama_step_rows(1)
                                             : model == "gpt2" ? test::gpt2_step_rows(1)
                                                               : test::bert_step_rows(1);
  EXPECT_EQ(test::kforge_rows(plan), expected);
}

INSTANTIATE_TEST_SUITE_P(Models, ExamplePlanGpuTest, ::testing::Values("llama", "gpt2", "bert"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kforge
