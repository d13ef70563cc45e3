// Assembling a Profile from CUPTI raw files (hand-written here, with known times): launch
// linking, NVTX nesting and context, region selection, several processes, and what could not be
// recorded.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "core/error.h"
#include "profile/cupti_import.h"
#include "profile/summary.h"
#include "test_support.h"

namespace kforge {
namespace {

using nlohmann::json;

// A raw file of one process, filled by the helpers below.
json raw_process(int64_t pid) {
  return {{"format", "kforge-cupti-raw"},
          {"version", 1},
          {"pid", pid},
          {"written_at", "exit"},
          {"dropped_records", 0},
          {"errors", json::array()},
          {"devices", json::array()},
          {"kernel_names", json::array()},
          {"kernels", json::array()},
          {"transfers", json::array()},
          {"api_calls", json::array()},
          {"markers", json::array()}};
}

void add_kernel(json& raw, const std::string& name, int64_t start, int64_t end, int64_t correlation,
                int64_t device = 0) {
  json& names = raw["kernel_names"];
  size_t index = 0;
  while (index < names.size() && names[index] != name)
    ++index;
  if (index == names.size()) names.push_back(name);
  raw["kernels"].push_back({{"name", index},
                            {"grid", {64, 2, 1}},
                            {"block", {128, 1, 1}},
                            {"cluster", {0, 0, 0}},
                            {"registers", 32},
                            {"static_smem", 512},
                            {"dynamic_smem", 0},
                            {"start", start},
                            {"end", end},
                            {"device", device},
                            {"stream", 7},
                            {"correlation", correlation}});
}

void add_launch(json& raw, int64_t correlation, int64_t thread, int64_t start,
                const std::string& api = "runtime") {
  raw["api_calls"].push_back({{"api", api},
                              {"cbid", 211},
                              {"correlation", correlation},
                              {"thread", thread},
                              {"start", start},
                              {"end", start + 5}});
}

void add_range(json& raw, int64_t id, int64_t thread, int64_t start, int64_t end,
               const std::string& name) {
  raw["markers"].push_back(
      {{"id", id}, {"kind", "start"}, {"time", start}, {"thread", thread}, {"name", name}});
  raw["markers"].push_back({{"id", id}, {"kind", "end"}, {"time", end}, {"thread", thread}});
}

std::vector<std::string> context_names(const KernelRecord& k) {
  std::vector<std::string> names;
  for (const auto& c : k.context)
    names.push_back(c.name);
  return names;
}

const KernelRecord& kernel_with_correlation(const Profile& p, int64_t correlation,
                                            int64_t pid = 0) {
  for (const auto& k : p.kernels) {
    if (k.correlation == correlation && (pid == 0 || k.pid == pid)) return k;
  }
  throw Error("no kernel with correlation " + std::to_string(correlation));
}

const std::string kAddmm = "aten::addmm, seq = 12, op_id = 3, sizes = [[8, 512], [512, 512]]";

TEST(CuptiImportTest, KernelsGetTheRangesOpenOnTheirLaunchThread) {
  json raw = raw_process(100);
  // Thread 1: step [100, 1000) > aten::linear [150, 400) > aten::addmm [200, 300).
  add_range(raw, 1, 1, 100, 1000, "step");
  add_range(raw, 2, 1, 150, 400, "aten::linear");
  add_range(raw, 3, 1, 200, 300, kAddmm);
  add_range(raw, 4, 2, 0, 2000, "other thread");
  add_kernel(raw, "_Z14rmsnorm_kernelPKfS0_Pfif", 5000, 5100, 10);
  add_launch(raw, 10, 1, 250);  // inside all three
  add_kernel(raw, "_Z14rmsnorm_kernelPKfS0_Pfif", 5200, 5300, 11);
  add_launch(raw, 11, 1, 400);  // aten::linear has just ended: [start, end)
  add_kernel(raw, "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 5400, 5600, 12);
  add_launch(raw, 12, 2, 260);                                // another thread: its own ranges only
  add_kernel(raw, "triton_poi_fused_add_0", 5700, 5800, 13);  // no launch call recorded

  const Profile p = assemble_profile({raw}, {});
  ASSERT_EQ(p.kernels.size(), 4u);
  EXPECT_EQ(p.source, "cupti");
  EXPECT_EQ(p.region, "all");
  EXPECT_EQ(context_names(kernel_with_correlation(p, 10)),
            (std::vector<std::string>{"step", "aten::linear", kAddmm}));
  EXPECT_EQ(context_names(kernel_with_correlation(p, 11)), (std::vector<std::string>{"step"}));
  EXPECT_EQ(context_names(kernel_with_correlation(p, 12)),
            (std::vector<std::string>{"other thread"}));
  EXPECT_TRUE(kernel_with_correlation(p, 13).context.empty());
  EXPECT_TRUE(kernel_with_correlation(p, 10).context[2].input_dims.empty());
  EXPECT_EQ(p.metadata["cupti"]["kernels_without_launch_call"], 1);

  const KernelRecord& k = kernel_with_correlation(p, 10);
  EXPECT_EQ(k.demangled, "rmsnorm_kernel(float const*, float const*, float*, int, float)");
  EXPECT_EQ(k.grid, (std::array<int64_t, 3>{64, 2, 1}));
  EXPECT_EQ(k.block, (std::array<int64_t, 3>{128, 1, 1}));
  EXPECT_EQ(k.registers, 32);
  EXPECT_EQ(k.static_smem, 512);
  EXPECT_EQ(k.stream, 7);
  EXPECT_EQ(k.pid, 100);
  EXPECT_EQ(k.duration_ns(), 100);
  EXPECT_EQ(kernel_with_correlation(p, 12).demangled, kernel_with_correlation(p, 12).name);
  EXPECT_EQ(kernel_with_correlation(p, 13).demangled, "triton_poi_fused_add_0");

  ASSERT_EQ(p.ranges.size(), 4u);
  std::map<std::string, int> depth;
  for (const auto& r : p.ranges)
    depth[r.name] = r.depth;
  EXPECT_EQ(depth["step"], 0);
  EXPECT_EQ(depth["aten::linear"], 1);
  EXPECT_EQ(depth[kAddmm], 2);
  EXPECT_EQ(depth["other thread"], 0);
}

TEST(CuptiImportTest, DriverLaunchesLinkLikeRuntimeOnes) {
  json raw = raw_process(7);
  add_range(raw, 1, 3, 0, 100, "triton region");
  add_kernel(raw, "triton_poi_fused_add_0", 1000, 1100, 5);
  add_launch(raw, 5, 3, 50, "driver");
  // A runtime call and the driver call inside it with one id: the outer call counts.
  add_kernel(raw, "_Z6kernelPf", 1200, 1300, 6);
  add_launch(raw, 6, 3, 120, "driver");
  add_launch(raw, 6, 3, 90, "runtime");
  const Profile p = assemble_profile({raw}, {});
  EXPECT_EQ(context_names(kernel_with_correlation(p, 5)),
            (std::vector<std::string>{"triton region"}));
  EXPECT_EQ(context_names(kernel_with_correlation(p, 6)),
            (std::vector<std::string>{"triton region"}));
  EXPECT_EQ(p.metadata["cupti"]["kernels_without_launch_call"], 0);
}

// Four iterations marked "step", two kernels each; a copy before the first and one in the last.
json four_steps(int64_t pid, int64_t thread, int64_t offset) {
  json raw = raw_process(pid);
  for (int64_t i = 0; i < 4; ++i) {
    const int64_t t0 = offset + i * 1000;
    add_range(raw, i + 1, thread, t0, t0 + 900, "step");
    add_kernel(raw, "_Z6matmulPKfS0_Pf", 100000 + t0, 100000 + t0 + 300, 2 * i + 1);
    add_launch(raw, 2 * i + 1, thread, t0 + 100);
    add_kernel(raw, "_Z7softmaxPf", 100000 + t0 + 300, 100000 + t0 + 400, 2 * i + 2);
    add_launch(raw, 2 * i + 2, thread, t0 + 200);
  }
  raw["transfers"].push_back({{"kind", "HtoD"},
                              {"bytes", 4096},
                              {"start", offset + 10},
                              {"end", offset + 20},
                              {"correlation", 100}});
  add_launch(raw, 100, thread, offset - 50);
  raw["transfers"].push_back({{"kind", "memset"},
                              {"bytes", 64},
                              {"start", 100000 + offset + 3500},
                              {"end", 100000 + offset + 3510},
                              {"correlation", 101}});
  add_launch(raw, 101, thread, offset + 3050);
  return raw;
}

TEST(CuptiImportTest, RegionKeepsWorkLaunchedInTheRangeAfterTheSkippedOccurrences) {
  AssembleOptions options;
  options.range = "step";
  options.skip = 2;
  options.command = {"python3", "train.py"};
  options.exit_code = 0;
  const Profile p = assemble_profile({four_steps(1, 1, 0)}, options);
  ASSERT_EQ(p.kernels.size(), 4u);
  for (const auto& k : p.kernels) {
    EXPECT_GE(k.correlation, 5) << "kernel of a skipped step kept";
    EXPECT_EQ(context_names(k), (std::vector<std::string>{"step"}));
  }
  ASSERT_EQ(p.transfers.size(), 1u);  // the copy before the first step is outside
  EXPECT_EQ(p.transfers[0].kind, "memset");
  EXPECT_NE(p.region.find("\"step\""), std::string::npos) << p.region;
  EXPECT_NE(p.region.find("2 of 4"), std::string::npos) << p.region;
  EXPECT_EQ(p.metadata["cupti"]["kernels_outside_region"], 4);
  EXPECT_EQ(p.command, options.command);
  ASSERT_TRUE(p.exit_code.has_value());
  EXPECT_EQ(*p.exit_code, 0);
  // Ranges are all kept, so the planner sees every iteration.
  EXPECT_EQ(p.ranges.size(), 4u);

  options.skip = 0;
  EXPECT_EQ(assemble_profile({four_steps(1, 1, 0)}, options).kernels.size(), 8u);
}

TEST(CuptiImportTest, RegionErrorsSayWhatWasRecorded) {
  AssembleOptions options;
  options.range = "iteration";
  try {
    assemble_profile({four_steps(1, 1, 0)}, options);
    FAIL() << "an unknown range must be rejected";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("ranges seen: \"step\""), std::string::npos) << e.what();
  }
  options.range = "step";
  options.skip = 4;
  try {
    assemble_profile({four_steps(1, 1, 0)}, options);
    FAIL() << "skipping every occurrence must be rejected";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("at most 4 time(s)"), std::string::npos) << e.what();
  }
  json no_ranges = raw_process(3);
  add_kernel(no_ranges, "k", 10, 20, 1);
  options.skip = 0;
  try {
    assemble_profile({no_ranges}, options);
    FAIL() << "a range in a run without NVTX must be rejected";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no NVTX ranges"), std::string::npos) << e.what();
  }
}

TEST(CuptiImportTest, ProcessesMergeWithTheirOwnLaunchesAndRanges) {
  // Two processes with the same correlation ids and thread numbers: each kernel must be linked
  // within its own process.
  json first = four_steps(1, 10, 0);
  json second = four_steps(2, 10, 500);
  first["devices"].push_back(
      {{"id", 0}, {"name", "NVIDIA H100"}, {"compute_capability", {9, 0}}, {"sm_count", 132}});
  second["devices"].push_back(
      {{"id", 0}, {"name", "NVIDIA H100"}, {"compute_capability", {9, 0}}, {"sm_count", 132}});
  second["devices"].push_back(
      {{"id", 1}, {"name", "NVIDIA H100"}, {"compute_capability", {9, 0}}, {"sm_count", 132}});
  AssembleOptions options;
  options.range = "step";
  options.skip = 1;  // per process
  const Profile p = assemble_profile({first, second}, options);
  EXPECT_EQ(p.kernels.size(), 12u);
  EXPECT_EQ(p.metadata["cupti"]["processes"].size(), 2u);
  EXPECT_NE(p.region.find("6 of 8"), std::string::npos) << p.region;
  ASSERT_EQ(p.devices.size(), 2u);
  EXPECT_EQ(p.devices[0].id, 0);
  EXPECT_EQ(p.devices[0].compute_major, 9);
  EXPECT_EQ(p.devices[0].sm_count, 132);
  EXPECT_EQ(p.devices[1].id, 1);
  // Sorted by start time, which interleaves the processes here.
  for (size_t i = 1; i < p.kernels.size(); ++i)
    EXPECT_LE(p.kernels[i - 1].start_ns, p.kernels[i].start_ns);
  EXPECT_EQ(kernel_with_correlation(p, 3, 2).start_ns, 100000 + 500 + 1000);
  EXPECT_EQ(kernel_with_correlation(p, 3, 1).start_ns, 100000 + 1000);
  int64_t ranges_of_second = 0;
  for (const auto& r : p.ranges)
    ranges_of_second += r.pid == 2;
  EXPECT_EQ(ranges_of_second, 4);
}

TEST(CuptiImportTest, ReportsWhatCouldNotBeRecorded) {
  json first = raw_process(1);
  first["dropped_records"] = 5;
  first["errors"].push_back("cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MARKER) failed: X");
  add_kernel(first, "k", 10, 20, 1);
  add_kernel(first, "k", 0, 0, 2);  // no timestamps: left out, counted
  json second = raw_process(2);
  second["dropped_records"] = 2;
  second["written_at"] = "signal 15";
  const Profile p = assemble_profile({first, second}, {});
  EXPECT_EQ(p.dropped_records, 7);
  EXPECT_EQ(p.kernels.size(), 1u);
  EXPECT_EQ(p.metadata["cupti"]["kernels_without_timestamps"], 1);
  const std::string summary = profile_summary(p);
  EXPECT_NE(summary.find("CUPTI dropped 7 activity records"), std::string::npos) << summary;
  EXPECT_NE(summary.find("process 2 ended by signal 15"), std::string::npos) << summary;
  EXPECT_NE(summary.find("KIND_MARKER) failed"), std::string::npos) << summary;
  EXPECT_NE(summary.find("1 kernels came without timestamps"), std::string::npos) << summary;
  EXPECT_NE(summary.find("processes    2"), std::string::npos) << summary;
}

TEST(CuptiImportTest, CountsTheApiCallsOfAllProcesses) {
  json first = raw_process(1);
  first["api_counts"] = {
      {{"api", "runtime"}, {"cbid", 211}, {"name", "cudaLaunchKernel_v7000"}, {"calls", 40}},
      {{"api", "runtime"}, {"cbid", 3}, {"name", "cudaGetDevice_v3020"}, {"calls", 90}}};
  json second = raw_process(2);
  second["api_counts"] = {
      {{"api", "runtime"}, {"cbid", 211}, {"name", "cudaLaunchKernel_v7000"}, {"calls", 70}},
      {{"api", "driver"}, {"cbid", 307}, {"calls", 5}}};  // no name: API and id
  const Profile p = assemble_profile({first, second, raw_process(3)}, {});
  const json& cupti = p.metadata["cupti"];
  EXPECT_EQ(cupti["api_calls_recorded"], 205);
  ASSERT_EQ(cupti["api_calls_by_name"].size(), 3u);
  EXPECT_EQ(cupti["api_calls_by_name"][0]["name"], "cudaLaunchKernel_v7000");
  EXPECT_EQ(cupti["api_calls_by_name"][0]["calls"], 110);
  EXPECT_EQ(cupti["api_calls_by_name"][1]["name"], "cudaGetDevice_v3020");
  EXPECT_EQ(cupti["api_calls_by_name"][2]["name"], "driver 307");
}

TEST(CuptiImportTest, UnclosedRangesLastUntilTheProcessEnds) {
  json raw = raw_process(1);
  raw["markers"].push_back(
      {{"id", 1}, {"kind", "start"}, {"time", 100}, {"thread", 1}, {"name", "forever"}});
  raw["markers"].push_back({{"id", 9}, {"kind", "end"}, {"time", 150}, {"thread", 1}});  // stray
  raw["markers"].push_back({{"id", 2}, {"kind", "instant"}, {"time", 160}, {"thread", 1}});
  add_kernel(raw, "k", 900, 950, 1);
  add_launch(raw, 1, 1, 700);
  const Profile p = assemble_profile({raw}, {});
  ASSERT_EQ(p.ranges.size(), 1u);
  EXPECT_EQ(p.ranges[0].start_ns, 100);
  EXPECT_EQ(p.ranges[0].end_ns, 950);
  EXPECT_EQ(context_names(p.kernels.at(0)), (std::vector<std::string>{"forever"}));
}

TEST(CuptiImportTest, RejectsFilesThatAreNotRawProfiles) {
  EXPECT_THROW(assemble_profile({json{{"format", "kforge-profile"}}}, {}), Error);
  json newer = raw_process(1);
  newer["version"] = 2;
  EXPECT_THROW(assemble_profile({newer}, {}), Error);
  json bad_name = raw_process(1);
  bad_name["kernels"].push_back({{"name", 3}, {"start", 1}, {"end", 2}});
  try {
    assemble_profile({bad_name}, {});
    FAIL() << "a kernel name index past kernel_names must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("process 1"), std::string::npos) << e.what();
  }
}

TEST(CuptiImportTest, ReadsOnlyRawFilesOfADirectory) {
  const auto dir = test::temp_dir("raw-files");
  std::ofstream(dir / "raw-2.json") << raw_process(2).dump();
  std::ofstream(dir / "raw-1.json") << raw_process(1).dump();
  std::ofstream(dir / "raw-3.json.tmp") << "{";  // a write that never finished
  std::ofstream(dir / "notes.txt") << "x";
  const auto raws = read_raw_files(dir);
  ASSERT_EQ(raws.size(), 2u);
  EXPECT_EQ(raws[0]["pid"], 1);
  std::ofstream(dir / "raw-4.json") << "{\"format\": ";
  EXPECT_THROW(read_raw_files(dir), Error);
}

TEST(CuptiImportTest, AssembledProfileRoundTrips) {
  AssembleOptions options;
  options.range = "step";
  const Profile p = assemble_profile({four_steps(1, 1, 0)}, options);
  const auto path = test::temp_dir("assembled") / "p.json";
  write_profile(p, path);
  const Profile back = read_profile(path);
  ASSERT_EQ(back.kernels.size(), p.kernels.size());
  EXPECT_EQ(back.kernels[0].context, p.kernels[0].context);
  EXPECT_EQ(back.region, p.region);
  EXPECT_EQ(back.busy_time_ns(), p.busy_time_ns());
}

TEST(CuptiImportTest, ShortKernelNames) {
  EXPECT_EQ(short_kernel_name("rmsnorm_kernel(float const*, float*, int)"), "rmsnorm_kernel");
  EXPECT_EQ(short_kernel_name("void at::native::vectorized_elementwise_kernel<4, "
                              "at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, "
                              "at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"),
            "at::native::vectorized_elementwise_kernel<...>");
  EXPECT_EQ(short_kernel_name("void (anonymous namespace)::softmax_warp_forward<float, float, "
                              "float, 10, false>(float*, float const*, int, int, int)"),
            "(anonymous namespace)::softmax_warp_forward<...>");
  EXPECT_EQ(short_kernel_name("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"),
            "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT");
  EXPECT_EQ(short_kernel_name("a_very_long_kernel_name_that_goes_on", 10), "a_very_...");
  EXPECT_EQ(demangle_kernel_name("_Znot_a_valid_mangling"), "_Znot_a_valid_mangling");
}

TEST(CuptiImportTest, SummaryListsTheKernelsThatTookMostTime) {
  AssembleOptions options;
  options.range = "step";
  const Profile p = assemble_profile({four_steps(1, 1, 0)}, options);
  const std::string summary = profile_summary(p, 1);
  // matmul: 4 calls x 300 ns = 1.2 us of 1.6 us.
  EXPECT_NE(summary.find("matmul"), std::string::npos) << summary;
  EXPECT_NE(summary.find("75.0%"), std::string::npos) << summary;
  EXPECT_EQ(summary.find("softmax"), std::string::npos) << summary;
  EXPECT_NE(summary.find("1 more kernels"), std::string::npos) << summary;
  EXPECT_NE(summary.find("kernels      8 (2 distinct)"), std::string::npos) << summary;
}

}  // namespace
}  // namespace kforge
