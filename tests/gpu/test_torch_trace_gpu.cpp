// GPU tests of the torch.profiler importer (CTest label `gpu`): run the LLaMA-like example under
// torch.profiler and import its trace. Skipped where no CUDA device is visible or PyTorch does
// not import.
#include <algorithm>
#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "core/process.h"
#include "device/backend.h"
#include "profile/torch_trace.h"
#include "test_support.h"

namespace kforge {
namespace {

class TorchTraceGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (list_cuda_devices().empty()) GTEST_SKIP() << "no CUDA device";
    if (!run_command({"python3", "-c", "import torch"}, std::chrono::minutes(2)).ok())
      GTEST_SKIP() << "python3 cannot import torch";
  }

  // Runs python/examples/llama.py with `extra` flags and a torch trace; returns the import.
  TorchTraceImport record_llama(const std::string& name, std::vector<std::string> extra) {
    const auto trace = test::temp_dir("torch-trace-gpu-" + name) / "trace.json";
    std::vector<std::string> argv = {
        "python3",       (test::source_root() / "python" / "examples" / "llama.py").string(),
        "--iters",       "3",
        "--warmup",      "1",
        "--torch-trace", trace.string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const CommandResult r = run_command(argv, std::chrono::minutes(5));
    EXPECT_TRUE(r.ok()) << r.output;
    EXPECT_NE(r.output.find("gpu_time_ms="), std::string::npos) << r.output;
    return read_torch_trace(trace);
  }
};

bool has_context(const KernelRecord& k, const std::string& prefix) {
  return std::any_of(k.context.begin(), k.context.end(),
                     [&](const OpContext& c) { return c.name.rfind(prefix, 0) == 0; });
}

// The innermost ATen op of a kernel, if it recorded input dims.
const OpContext* aten_with_dims(const KernelRecord& k) {
  for (auto it = k.context.rbegin(); it != k.context.rend(); ++it) {
    if (it->name.rfind("aten::", 0) == 0 && !it->input_dims.empty()) return &*it;
  }
  return nullptr;
}

TEST_F(TorchTraceGpuTest, LlamaInferenceKernelsCarryAtenOpsWithDims) {
  const TorchTraceImport t = record_llama("inference", {});
  const Profile& p = t.profile;
  ASSERT_FALSE(p.kernels.empty());
  EXPECT_FALSE(p.devices.empty());
  EXPECT_GT(p.kernel_time_ns(), 0);
  int64_t transfer_ns = 0;
  for (const auto& x : p.transfers)
    transfer_ns += x.duration_ns();
  EXPECT_GT(p.busy_time_ns(), 0);
  EXPECT_LE(p.busy_time_ns(), p.kernel_time_ns() + transfer_ns);
  size_t with_dims = 0;
  for (const auto& k : p.kernels)
    with_dims += aten_with_dims(k) != nullptr ? 1 : 0;
  // Nearly every kernel of an eager forward comes from an ATen op with recorded shapes.
  EXPECT_GE(with_dims * 10, p.kernels.size() * 9) << with_dims << " of " << p.kernels.size();
  EXPECT_LE(t.unlinked * 100, static_cast<int64_t>(p.kernels.size()));

  // The GEMMs of the default model (batch 4, seq 512, dim 1024) sit under aten::linear with
  // its operands' dims.
  const bool found_linear = std::any_of(p.kernels.begin(), p.kernels.end(), [](const auto& k) {
    return std::any_of(k.context.begin(), k.context.end(), [](const OpContext& c) {
      return c.name == "aten::linear" && !c.input_dims.empty() &&
             c.input_dims[0] == std::vector<int64_t>{4, 512, 1024};
    });
  });
  EXPECT_TRUE(found_linear);
  // Module ranges name the composite ops with their sizes.
  const auto count_with = [&](const std::string& prefix) {
    return std::count_if(p.kernels.begin(), p.kernels.end(),
                         [&](const auto& k) { return has_context(k, prefix); });
  };
  EXPECT_GT(count_with("module::RMSNorm, sizes = [[4, 512, 1024], [1024]]"), 0);
  EXPECT_GT(count_with("module::RotaryEmbeddingHalf, sizes = [[4, 16, 512, 64], [512, 32], "
                       "[512, 32]]"),
            0);
  EXPECT_GT(count_with("module::SwiGLU, sizes = [[4, 512, 1024], [2816, 1024], [2816, 1024], "
                       "[1024, 2816]]"),
            0);
  EXPECT_GT(count_with("module::CrossEntropyLoss"), 0);
  const auto steps = std::count_if(p.ranges.begin(), p.ranges.end(),
                                   [](const RangeRecord& r) { return r.name == "step"; });
  EXPECT_EQ(steps, 3);
}

TEST_F(TorchTraceGpuTest, LlamaTrainingBackwardKernelsCarryAutogradContext) {
  const TorchTraceImport t = record_llama("train", {"--train", "--kv-heads", "4"});
  const Profile& p = t.profile;
  ASSERT_FALSE(p.kernels.empty());
  const auto backward = std::count_if(p.kernels.begin(), p.kernels.end(), [](const auto& k) {
    return std::any_of(k.context.begin(), k.context.end(), [](const OpContext& c) {
      return c.name.find("Backward") != std::string::npos;
    });
  });
  EXPECT_GT(backward, 0);
  EXPECT_LE(t.unlinked * 100, static_cast<int64_t>(p.kernels.size()));
}

}  // namespace
}  // namespace kforge
