// The importers, the classifier and the planner on runs recorded on an H200
// (tests/data/recorded/README.md says how): CUPTI raw files as the injection library wrote them
// for the CUDA C++ example and the GPT-2-, LLaMA- and BERT-like example models under NVTX, and
// torch.profiler traces of the LLaMA and BERT models.
//
// What is expected comes from the programs, not from kforge: the example models' sizes and
// layer counts say which ops run how often at which shapes (example_model_rows.h; two layers,
// one timed step).
#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "device/ceilings.h"
#include "example_model_rows.h"
#include "plan_checks.h"
#include "profile/cupti_import.h"
#include "profile/planner.h"
#include "profile/torch_trace.h"
#include "test_support.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using test::bert_step_rows;
using test::expect_each_kernel_counted_once;
using test::gpt2_step_rows;
using test::kforge_rows;
using test::llama_step_rows;
using test::row;

fs::path recorded(const std::string& name) {
  return fs::path(test::test_data_dir()) / "recorded" / name;
}

// The timed step of a model run with --warmup 1 --iters 1, as `kforge profile --range step
// --skip 1` selects it.
Profile timed_step(const std::string& directory) {
  AssembleOptions options;
  options.range = "step";
  options.skip = 1;
  return assemble_profile(read_raw_files(recorded(directory)), options);
}

PlanOptions h200() {
  const Ceilings c = read_ceilings_file(recorded("ceilings_h200.json"));
  PlanOptions options;
  options.copy_gbps = c.copy_gbps;
  options.matmul_tflops = c.matmul_tflops;
  return options;
}

// The op that launched a kernel: its innermost context entry's name up to the first comma.
std::string launching_op(const KernelRecord& k) {
  if (k.context.empty()) return "";
  const std::string& text = k.context.back().name;
  return text.substr(0, text.find(','));
}

// Whether a context entry of the kernel starts with `prefix`.
bool inside(const KernelRecord& k, const std::string& prefix) {
  return std::any_of(k.context.begin(), k.context.end(),
                     [&](const OpContext& c) { return c.name.starts_with(prefix); });
}

TEST(RecordedProfiles, CudaExampleStepsFromRawRecords) {
  // kforge_example_cuda --iters 2 --warmup 1: 8 kernels per step, each step an NVTX range.
  const Profile all = assemble_profile(read_raw_files(recorded("cuda_example")), {});
  const Profile p = timed_step("cuda_example");
  EXPECT_EQ(p.source, "cupti");
  ASSERT_EQ(p.devices.size(), 1u);
  EXPECT_EQ(p.devices[0].name, "NVIDIA H200");
  EXPECT_EQ(p.dropped_records, 0);
  ASSERT_EQ(p.kernels.size(), 16u);
  EXPECT_EQ(all.kernels.size(), 24u);  // the warm-up step as well
  std::map<std::string, int> by_name;
  for (const auto& k : p.kernels) {
    by_name[k.demangled.substr(0, k.demangled.find('('))] += 1;
    ASSERT_FALSE(k.context.empty());
    EXPECT_EQ(k.context.front().name, "step");
    EXPECT_GT(k.duration_ns(), 0);
    EXPECT_GT(k.registers, 0);
  }
  // Five GEMMs (qkv, scores, context, out, up), then rmsnorm, softmax, swiglu per step.
  EXPECT_EQ(by_name.size(), 4u);
  for (const auto& [name, count] : by_name) {
    const bool gemm = name.find("matmul_tiled_kernel") != std::string::npos;
    EXPECT_EQ(count, gemm ? 10 : 2) << name;
  }
  // One stream, kernels back to back: no kernel overlaps another, busy time covers them all.
  EXPECT_LE(p.kernel_time_ns(), p.busy_time_ns());
}

TEST(RecordedProfiles, LlamaUnderNvtxPlansEveryOpAtItsShape) {
  const Profile p = timed_step("llama_nvtx");
  ASSERT_EQ(p.devices.size(), 1u);
  EXPECT_EQ(p.dropped_records, 0);
  for (const auto& k : p.kernels)
    ASSERT_FALSE(k.context.empty()) << k.demangled << ": launched outside every NVTX range";

  const Plan plan = make_plan(p, h200());
  expect_each_kernel_counted_once(p, plan);
  EXPECT_EQ(kforge_rows(plan), llama_step_rows(2));
  // Only the residual adds and the embedding lookup (outside every module range) are no
  // kforge op.
  int64_t adds_and_lookups = 0, other = 0;
  for (const auto& k : p.kernels) {
    const bool residual_add = launching_op(k) == "aten::add" && !inside(k, "module::");
    adds_and_lookups += residual_add || inside(k, "aten::embedding");
  }
  for (const auto& g : plan.groups)
    other += g.op == "other" ? g.kernels : 0;
  EXPECT_EQ(other, adds_and_lookups);
  EXPECT_EQ(adds_and_lookups, 5);  // 2 residual adds per layer, 1 lookup
  // NVTX ranges carry no dtypes and cuDNN's kernel names do not tell bf16 from f16: the
  // attention and the nvjet GEMMs take the dtype of the kernels around them; causal comes from
  // the Attention module's range.
  const PlanGroup& attention =
      row(plan, "flash_attention", "4x16x512x64,causal=1,scale_permille=0");
  EXPECT_EQ(attention.dtype_source, "enclosing range");
  for (const auto& note : attention.notes)
    EXPECT_EQ(note.find("causal"), std::string::npos) << note;
  EXPECT_EQ(row(plan, "matmul", "2048x1024x1024").dtype_source, "enclosing range");
  EXPECT_EQ(row(plan, "rmsnorm", "2048x1024").dtype_source, "kernel name");

  // The LM head's GEMM ran faster than cuBLAS did at 8192^3 when the ceilings were measured:
  // its throughput becomes the ceiling, and it has nothing left to gain.
  const PlanGroup& lm_head = row(plan, "matmul", "2048x16384x1024");
  ASSERT_TRUE(plan.raised_matmul_tflops && h200().matmul_tflops);
  EXPECT_GT(*plan.raised_matmul_tflops, *h200().matmul_tflops);
  EXPECT_DOUBLE_EQ(*plan.raised_matmul_tflops, *lm_head.achieved_tflops());
  EXPECT_DOUBLE_EQ(*lm_head.s_max, 1.0);
  EXPECT_EQ(lm_head.bound, "compute");
}

TEST(RecordedProfiles, LlamaTorchTraceAgreesWithTheNvtxRecording) {
  const TorchTraceImport trace = read_torch_trace(recorded("llama_trace.json"));
  EXPECT_EQ(trace.unlinked, 0);
  const Profile nvtx = timed_step("llama_nvtx");
  // Two runs of the same step: the same kernels, each once (CPU ops are no rows).
  EXPECT_EQ(trace.profile.kernels.size(), nvtx.kernels.size());

  const Plan plan = make_plan(trace.profile, h200());
  expect_each_kernel_counted_once(trace.profile, plan);
  EXPECT_EQ(kforge_rows(plan), llama_step_rows(2));
  const Plan nvtx_plan = make_plan(nvtx, h200());
  for (const auto& g : plan.groups) {
    if (g.op == "other") continue;
    // ATen ops carry their input types; module ranges do not, their kernels name it.
    const bool module = g.op == "rmsnorm" || g.op == "fused_mlp" || g.op.starts_with("rotary");
    EXPECT_EQ(g.dtype_source, module ? "kernel name" : "input types") << g.op << " " << g.shape;
    EXPECT_EQ(g.kernels, row(nvtx_plan, g.op, g.shape).kernels) << g.op << " " << g.shape;
  }
}

TEST(RecordedProfiles, Gpt2UnderNvtx) {
  const Profile p = timed_step("gpt2_nvtx");
  const Plan plan = make_plan(p, h200());
  expect_each_kernel_counted_once(p, plan);
  EXPECT_EQ(kforge_rows(plan), gpt2_step_rows(2));
}

TEST(RecordedProfiles, BertFromNvtxAndFromItsTorchTrace) {
  const Profile p = timed_step("bert_nvtx");
  const Plan plan = make_plan(p, h200());
  expect_each_kernel_counted_once(p, plan);
  EXPECT_EQ(kforge_rows(plan), bert_step_rows(2));

  const TorchTraceImport trace = read_torch_trace(recorded("bert_trace.json"));
  const Plan trace_plan = make_plan(trace.profile, h200());
  expect_each_kernel_counted_once(trace.profile, trace_plan);
  EXPECT_EQ(kforge_rows(trace_plan), bert_step_rows(2));

  // The 16x4 classifier GEMM's roofline is a few nanoseconds; no kernel of the run took less
  // than the shortest one, which bounds it instead.
  const PlanGroup& classifier = row(plan, "matmul_bias", "16x4x768");
  EXPECT_EQ(classifier.bound, "latency");
  EXPECT_EQ(*classifier.best_ns_per_call, static_cast<double>(plan.shortest_kernel_ns));
}

}  // namespace
}  // namespace kforge
