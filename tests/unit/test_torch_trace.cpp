// The torch.profiler trace importer against tests/data/traces/small_torch_trace.json, a
// hand-written trace in Kineto's format: a record_function "step" around a module range
// (RMSNorm) with two ATen ops, aten::linear -> aten::addmm with a launch and an "ac2g" flow, a
// copy and a fill, a backward op on the autograd thread at the same time as a forward op on
// the main thread, a kernel launched outside any op, one with no launch in the trace, one
// linked by "External id" only, and events kforge must not count or follow (python_function,
// gpu_user_annotation, a Trace span, a fwdbwd flow).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/process.h"
#include "profile/torch_trace.h"
#include "test_support.h"

namespace kforge {
namespace {

std::filesystem::path trace_path() {
  return std::filesystem::path(test::test_data_dir()) / "traces" / "small_torch_trace.json";
}

const TorchTraceImport& imported() {
  static const TorchTraceImport result = read_torch_trace(trace_path());
  return result;
}

const KernelRecord& kernel_named(const std::string& prefix) {
  const auto& kernels = imported().profile.kernels;
  const auto it = std::find_if(kernels.begin(), kernels.end(),
                               [&](const KernelRecord& k) { return k.name.rfind(prefix, 0) == 0; });
  if (it == kernels.end()) throw Error("no kernel named " + prefix);
  return *it;
}

std::vector<std::string> context_names(const KernelRecord& k) {
  std::vector<std::string> names;
  for (const auto& c : k.context)
    names.push_back(c.name);
  return names;
}

const std::string kRmsNormRange = "module::RMSNorm, sizes = [[2, 8, 64], [64]]";

TEST(TorchTraceTest, EveryKernelIsOneRowAndCpuOpsAreNone) {
  const Profile& p = imported().profile;
  EXPECT_EQ(p.source, "torch-trace");
  ASSERT_EQ(p.kernels.size(), 9u);
  for (const auto& k : p.kernels) {
    EXPECT_EQ(k.name.rfind("aten::", 0), std::string::npos) << k.name;
    EXPECT_EQ(k.name.rfind("module::", 0), std::string::npos) << k.name;  // gpu_user_annotation
    EXPECT_EQ(k.name.rfind("cuda", 0), std::string::npos) << k.name;      // runtime calls
  }
  EXPECT_TRUE(std::is_sorted(
      p.kernels.begin(), p.kernels.end(),
      [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; }));
  EXPECT_EQ(imported().cpu_ops, 11);
  EXPECT_EQ(imported().user_annotations, 2);
}

TEST(TorchTraceTest, ConvertsMicrosecondsToNanoseconds) {
  const KernelRecord& k = kernel_named("nvjet_hsh");
  EXPECT_EQ(k.start_ns, 1105125);  // ts 1105.125 us
  EXPECT_EQ(k.end_ns, 1117625);    // + dur 12.5 us
  EXPECT_EQ(kernel_named("void at::native::elementwise_kernel").duration_ns(), 1750);
}

TEST(TorchTraceTest, TotalAndBusyTime) {
  const Profile& p = imported().profile;
  EXPECT_EQ(p.kernel_time_ns(), 2500 + 1750 + 12500 + 10000 + 1000 + 8000 + 4000 + 1000 + 2000);
  // overlap_kernel (stream 13) runs under the nvjet kernel: [1105125, 1120000) counts once;
  // the copy and the fill add their own time.
  EXPECT_EQ(p.busy_time_ns(),
            2500 + 1750 + (1120000 - 1105125) + 3000 + 1000 + 1000 + 8000 + 4000 + 1000 + 2000);
}

TEST(TorchTraceTest, KernelContextIsTheEnclosingOpsOutermostFirst) {
  EXPECT_EQ(context_names(kernel_named("nvjet_hsh")),
            (std::vector<std::string>{"step", "aten::linear", "aten::addmm"}));
  EXPECT_EQ(context_names(kernel_named("void at::native::vectorized_elementwise_kernel")),
            (std::vector<std::string>{"step", kRmsNormRange, "aten::pow"}));
  EXPECT_EQ(context_names(kernel_named("void at::native::elementwise_kernel")),
            (std::vector<std::string>{"step", kRmsNormRange, "aten::mul"}));
  // python_function frames ("nn.Module: Llama_0") are not context.
}

TEST(TorchTraceTest, ContextCarriesInputDimsAndTypes) {
  const KernelRecord& k = kernel_named("nvjet_hsh");
  ASSERT_EQ(k.context.size(), 3u);
  const OpContext& step = k.context[0];
  EXPECT_TRUE(step.input_dims.empty());
  const OpContext& linear = k.context[1];
  EXPECT_EQ(linear.input_dims, (std::vector<std::vector<int64_t>>{{16, 64}, {128, 64}, {128}}));
  const OpContext& addmm = k.context[2];
  EXPECT_EQ(addmm.input_dims,
            (std::vector<std::vector<int64_t>>{{128}, {16, 64}, {64, 128}, {}, {}}));
  EXPECT_EQ(addmm.input_types, (std::vector<std::string>{"c10::BFloat16", "c10::BFloat16",
                                                         "c10::BFloat16", "Scalar", "Scalar"}));
  // The module range keeps its text whole: the planner reads the sizes from the name.
  const KernelRecord& pow = kernel_named("void at::native::vectorized_elementwise_kernel");
  EXPECT_EQ(pow.context[1].name, kRmsNormRange);
  EXPECT_TRUE(pow.context[1].input_dims.empty());
  EXPECT_EQ(pow.context[2].input_dims, (std::vector<std::vector<int64_t>>{{2, 8, 64}, {}}));
}

TEST(TorchTraceTest, TensorListInputsGiveEmptyDims) {
  const KernelRecord& k = kernel_named("void at::native::(anonymous namespace)::CatArray");
  ASSERT_EQ(context_names(k), (std::vector<std::string>{"step", "aten::cat"}));
  EXPECT_EQ(k.context[1].input_dims, (std::vector<std::vector<int64_t>>{{}, {}}));
  EXPECT_EQ(k.context[1].input_types, (std::vector<std::string>{"TensorList", "Scalar"}));
}

TEST(TorchTraceTest, LaunchArgumentsAreKept) {
  const KernelRecord& k = kernel_named("nvjet_hsh");
  EXPECT_EQ(k.grid, (std::array<int64_t, 3>{2, 1, 1}));
  EXPECT_EQ(k.block, (std::array<int64_t, 3>{384, 1, 1}));
  EXPECT_EQ(k.registers, 168);
  EXPECT_EQ(k.static_smem + k.dynamic_smem, 213000);
  EXPECT_EQ(k.stream, 7);
  EXPECT_EQ(k.device, 0);
  EXPECT_EQ(k.pid, 4242);  // the launching process, not the trace's GPU track
  EXPECT_EQ(k.correlation, 103);
  EXPECT_EQ(kernel_named("overlap_kernel").grid, (std::array<int64_t, 3>{4, 2, 1}));
  EXPECT_EQ(kernel_named("overlap_kernel").stream, 13);
}

TEST(TorchTraceTest, ContextComesFromTheLaunchingThreadOnly) {
  // aten::to runs on the main thread while the autograd thread launches the backward mm.
  EXPECT_EQ(
      context_names(kernel_named("nvjet_mm_bwd")),
      (std::vector<std::string>{"autograd::engine::evaluate_function: MmBackward0", "aten::mm"}));
  EXPECT_EQ(context_names(kernel_named("overlap_kernel")),
            (std::vector<std::string>{"step", "aten::to"}));
}

TEST(TorchTraceTest, KernelsWithoutAnOpOrALaunch) {
  // Launched by cuLaunchKernel outside every op; linked through the ac2g flow (no correlation
  // in its args): kept, with no context.
  const KernelRecord& triton = kernel_named("triton_poi_fused_add_0");
  EXPECT_TRUE(triton.context.empty());
  EXPECT_EQ(triton.correlation, 106);
  EXPECT_EQ(triton.pid, 4242);
  // No launch in the trace: kept, unlinked.
  EXPECT_TRUE(kernel_named("unlinked_kernel").context.empty());
  // No launch, but Kineto's "External id" names aten::addmm. (A fwdbwd flow ends at the same
  // place; only ac2g flows carry correlation ids.)
  EXPECT_EQ(context_names(kernel_named("external_id_kernel")),
            (std::vector<std::string>{"step", "aten::linear", "aten::addmm"}));
  EXPECT_EQ(imported().linked_by_correlation, 7);
  EXPECT_EQ(imported().linked_by_external_id, 1);
  EXPECT_EQ(imported().unlinked, 1);
}

TEST(TorchTraceTest, TransfersFromCopiesAndFills) {
  const auto& t = imported().profile.transfers;
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].kind, "HtoD");
  EXPECT_EQ(t[0].bytes, 4096);
  EXPECT_EQ(t[0].start_ns, 1130000);
  EXPECT_EQ(t[0].end_ns, 1133000);
  EXPECT_EQ(t[0].stream, 7);
  EXPECT_EQ(t[0].pid, 4242);
  EXPECT_EQ(t[1].kind, "memset");
  EXPECT_EQ(t[1].bytes, 1024);
}

TEST(TorchTraceTest, DevicesAndRanges) {
  const Profile& p = imported().profile;
  ASSERT_EQ(p.devices.size(), 1u);
  EXPECT_EQ(p.devices[0], (DeviceRecord{0, "NVIDIA H100 80GB HBM3", 9, 0, 132}));
  ASSERT_EQ(p.ranges.size(), 2u);
  EXPECT_EQ(p.ranges[0].name, "step");
  EXPECT_EQ(p.ranges[0].depth, 0);
  EXPECT_EQ(p.ranges[0].start_ns, 1000000);
  EXPECT_EQ(p.ranges[0].end_ns, 1300000);
  EXPECT_EQ(p.ranges[0].thread, 4242);
  EXPECT_EQ(p.ranges[1].name, kRmsNormRange);
  EXPECT_EQ(p.ranges[1].depth, 1);
  EXPECT_EQ(p.metadata.at("torch_trace").at("trace_schema_version"), 1);
}

TEST(TorchTraceTest, SurvivesTheProfileFileRoundTrip) {
  const auto path = test::temp_dir("torch-trace") / "profile.json";
  write_profile(imported().profile, path);
  const Profile back = read_profile(path);
  EXPECT_EQ(back.source, "torch-trace");
  ASSERT_EQ(back.kernels.size(), imported().profile.kernels.size());
  EXPECT_EQ(back.kernels[2].context, imported().profile.kernels[2].context);
}

TEST(TorchTraceTest, ReadsABareEventArrayAndEventsMissingFields) {
  const auto trace = nlohmann::json::parse(R"([
    {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
     "ts": 11, "dur": 1, "args": {"correlation": 5}},
    {"ph": "X", "cat": "kernel", "name": "relu_kernel", "pid": 0, "tid": 7, "ts": 20.5,
     "args": {"correlation": 5}},
    {"ph": "X", "cat": "kernel", "name": "no_time"},
    {"ph": "X", "cat": "kernel", "ts": 30, "dur": 1},
    "not an event",
    {"ph": 5, "cat": "kernel", "name": "odd phase", "ts": 1, "dur": 1},
    {"ph": "X", "cat": 7, "name": "odd category", "ts": 1, "dur": 1}
  ])");
  const TorchTraceImport result = import_torch_trace(trace);
  ASSERT_EQ(result.profile.kernels.size(), 2u);
  const KernelRecord& k = result.profile.kernels[0];
  EXPECT_EQ(k.name, "relu_kernel");
  EXPECT_EQ(k.start_ns, 20500);
  EXPECT_EQ(k.end_ns, 20500);  // no "dur"
  EXPECT_EQ(k.stream, 7);      // from the track when args lack "stream"
  ASSERT_EQ(k.context.size(), 1u);
  EXPECT_EQ(k.context[0].name, "aten::relu");
  EXPECT_TRUE(k.context[0].input_dims.empty());
  EXPECT_EQ(result.profile.kernels[1].name, "");
  EXPECT_EQ(result.profile.metadata.at("torch_trace").at("skipped_events"), 2);
}

TEST(TorchTraceTest, KeepsTheNanosecondsOfLargeTimestamps) {
  // Traces on an uptime-based clock have timestamps near 2^42 us.
  const auto trace = nlohmann::json::parse(R"({"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "tid": 7, "ts": 4406799442996.111,
     "dur": 1.5},
    {"ph": "X", "cat": "kernel", "name": "b", "pid": 0, "tid": 7, "ts": 4406799442997.999,
     "dur": 0.001}
  ]})");
  const Profile p = import_torch_trace(trace).profile;
  ASSERT_EQ(p.kernels.size(), 2u);
  EXPECT_EQ(p.kernels[0].start_ns, 4406799442996111);
  EXPECT_EQ(p.kernels[0].end_ns, 4406799442997611);
  EXPECT_EQ(p.kernels[1].start_ns, 4406799442997999);
  EXPECT_EQ(p.kernels[1].duration_ns(), 1);
}

TEST(TorchTraceTest, RejectsWhatIsNotAChromeTrace) {
  EXPECT_THROW(import_torch_trace(nlohmann::json::parse(R"({"kernels": []})")), UsageError);
  EXPECT_THROW(import_torch_trace(nlohmann::json::parse(R"({"traceEvents": 3})")), UsageError);
  EXPECT_THROW(import_torch_trace(nlohmann::json::parse("42")), UsageError);
  EXPECT_THROW(
      import_torch_trace(nlohmann::json::parse(R"({"format": "kforge-profile", "version": 1})")),
      UsageError);

  const auto dir = test::temp_dir("torch-trace-bad");
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return dir / name;
  };
  EXPECT_THROW(read_torch_trace(write("truncated.json", R"({"traceEvents": [{"ph": "X")")),
               UsageError);
  EXPECT_THROW(read_torch_trace(write("gzip.json.gz", std::string("\x1f\x8b\x08\x00", 4))),
               UsageError);
  EXPECT_THROW(read_torch_trace(dir / "missing.json"), UsageError);
  try {
    read_torch_trace(write("other.json", R"({"kernels": []})"));
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("traceEvents"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("other.json"), std::string::npos) << e.what();
  }
}

TEST(TorchTraceTest, CommandWritesTheProfileAndASummary) {
  const auto out = test::temp_dir("torch-trace-cli") / "profile.json";
  const CommandResult r = run_command(
      {test::kforge_binary(), "import-torch-trace", trace_path().string(), "--out", out.string()});
  ASSERT_TRUE(r.ok()) << r.output;
  EXPECT_NE(r.output.find("9 kernels"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("nvjet_hsh_64x8_64x16_2x1_v_bz_TNT"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("aten::addmm"), std::string::npos) << r.output;
  const Profile p = read_profile(out);
  EXPECT_EQ(p.kernels.size(), 9u);
  EXPECT_EQ(p.metadata.at("torch_trace").at("file"), trace_path().string());
  EXPECT_TRUE(p.metadata.contains("kforge_git_sha")) << p.metadata.dump();

  const CommandResult bad =
      run_command({test::kforge_binary(), "import-torch-trace", "/nonexistent/trace.json"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
}

}  // namespace
}  // namespace kforge
