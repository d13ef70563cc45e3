// `kforge profile` on a GPU (CTest label `gpu`): the example transformer block
// (python/examples/cuda/transformer_block.cu) profiled unchanged, its warm-up skipped by NVTX
// range, checked against what the program itself knows: its kernels, their count, and the GPU
// time it measured with CUDA events. Also programs that fail, and commands of several processes.
// Skipped cleanly where no CUDA device is visible.
#include <cstdlib>
#include <map>
#include <optional>

#include <gtest/gtest.h>

#include "core/process.h"
#include "device/backend.h"
#include "profile/profile.h"
#include "test_support.h"

namespace kforge {
namespace {

constexpr int kKernelsPerIteration = 8;  // rmsnorm, 5 matmuls, softmax, swiglu

class ProfileGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (list_cuda_devices().empty()) GTEST_SKIP() << "no CUDA device";
  }
};

std::string example_binary() {
  return (std::filesystem::path(test::kforge_binary()).parent_path() / "kforge_example_cuda")
      .string();
}

CommandResult profile(const std::filesystem::path& out, std::vector<std::string> options,
                      const std::vector<std::string>& command) {
  std::vector<std::string> args = {test::kforge_binary(), "profile", "--out", out.string()};
  args.insert(args.end(), options.begin(), options.end());
  args.push_back("--");
  args.insert(args.end(), command.begin(), command.end());
  return run_command(args, std::chrono::minutes(5));
}

double printed_gpu_time_ms(const std::string& output) {
  const auto at = output.find("gpu_time_ms=");
  if (at == std::string::npos) return -1;
  return std::stod(output.substr(at + std::string("gpu_time_ms=").size()));
}

// Calls per kernel, by the kernel's name up to its parameter list.
std::map<std::string, int> calls_by_kernel(const Profile& p) {
  std::map<std::string, int> calls;
  for (const auto& k : p.kernels)
    ++calls[k.demangled.substr(0, k.demangled.find('('))];
  return calls;
}

TEST_F(ProfileGpuTest, ProfilesTheExampleWithItsWarmUpSkipped) {
  const auto out = test::temp_dir("profile-gpu") / "p.json";
  const CommandResult r = profile(out, {"--range", "step", "--skip", "2"},
                                  {example_binary(), "--iters", "10", "--warmup", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Profile p = read_profile(out);
  EXPECT_EQ(p.dropped_records, 0);
  EXPECT_EQ(p.kernels.size(), static_cast<size_t>(10 * kKernelsPerIteration)) << r.output;
  const auto calls = calls_by_kernel(p);
  EXPECT_EQ(calls.at("rmsnorm_kernel"), 10) << r.output;
  EXPECT_EQ(calls.at("matmul_tiled_kernel"), 50) << r.output;
  EXPECT_EQ(calls.at("softmax_rows_kernel"), 10) << r.output;
  EXPECT_EQ(calls.at("swiglu_kernel"), 10) << r.output;
  for (const auto& k : p.kernels) {
    ASSERT_FALSE(k.context.empty()) << k.demangled;
    EXPECT_EQ(k.context.front().name, "step");
    EXPECT_GT(k.duration_ns(), 0) << k.demangled;
    EXPECT_GT(k.registers, 0) << k.demangled;
    if (k.demangled.starts_with("matmul_tiled_kernel")) {
      EXPECT_EQ(k.block, (std::array<int64_t, 3>{16, 16, 1}));
      EXPECT_GE(k.static_smem, 2 * 16 * 16 * 4);
    }
  }
  EXPECT_TRUE(p.transfers.empty()) << "the input copies come before the first step";
  ASSERT_FALSE(p.devices.empty());
  EXPECT_FALSE(p.devices[0].name.empty());
  EXPECT_GT(p.devices[0].sm_count, 0);
  EXPECT_GE(p.devices[0].compute_major, 7);

  // The program timed the same 10 iterations with events; the GPU ran them back to back.
  const double gpu_ms = printed_gpu_time_ms(r.output);
  ASSERT_GT(gpu_ms, 0) << r.output;
  const double busy_ms = static_cast<double>(p.busy_time_ns()) * 1e-6;
  EXPECT_NEAR(busy_ms, gpu_ms, 0.05 * gpu_ms) << r.output;
}

// On a machine whose GPU took the profile, `kforge plan` measures the ceilings it has not got.
TEST_F(ProfileGpuTest, PlanMeasuresMissingCeilingsOnTheGpuHere) {
  const auto dir = test::temp_dir("plan-measures");
  const auto out = dir / "p.json";
  ASSERT_EQ(profile(out, {"--range", "step", "--skip", "1"},
                    {example_binary(), "--iters", "3", "--warmup", "1"})
                .exit_code,
            0);
  const char* before = std::getenv("KFORGE_CACHE_DIR");
  const std::optional<std::string> saved =
      before ? std::optional<std::string>(before) : std::nullopt;
  ::setenv("KFORGE_CACHE_DIR", (dir / "empty-cache").c_str(), 1);
  const CommandResult r =
      run_command({test::kforge_binary(), "plan", out.string()}, std::chrono::minutes(5));
  if (saved) {
    ::setenv("KFORGE_CACHE_DIR", saved->c_str(), 1);
  } else {
    ::unsetenv("KFORGE_CACHE_DIR");
  }
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("measuring them on cuda:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("measured now on this machine"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir / "empty-cache" / "ceilings")) << r.output;
}

TEST_F(ProfileGpuTest, WithoutARegionEverythingIsKept) {
  const auto out = test::temp_dir("profile-gpu-all") / "p.json";
  const CommandResult r =
      profile(out, {}, {example_binary(), "--iters", "3", "--warmup", "1", "--tokens", "128"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Profile p = read_profile(out);
  EXPECT_EQ(p.region, "all");
  EXPECT_EQ(p.kernels.size(), static_cast<size_t>(4 * kKernelsPerIteration));
  int host_to_device = 0;
  int device_to_host = 0;
  for (const auto& t : p.transfers) {
    host_to_device += t.kind == "HtoD";
    device_to_host += t.kind == "DtoH";
  }
  EXPECT_EQ(host_to_device, 5);  // x and four weights
  EXPECT_EQ(device_to_host, 1);  // the result
  int steps = 0;
  for (const auto& range : p.ranges)
    steps += range.name == "step" && range.depth == 0;
  EXPECT_EQ(steps, 4);
}

TEST_F(ProfileGpuTest, FailingProgramsStillLeaveAProfile) {
  const auto dir = test::temp_dir("profile-gpu-fail");
  const std::vector<std::string> small = {"--iters", "1", "--warmup", "1", "--tokens", "64"};
  std::vector<std::string> command = {example_binary()};
  command.insert(command.end(), small.begin(), small.end());

  auto failing = command;
  failing.insert(failing.end(), {"--exit-code", "3"});
  const CommandResult exited = profile(dir / "exit.json", {}, failing);
  EXPECT_EQ(exited.exit_code, 3) << exited.output;
  const Profile after_exit = read_profile(dir / "exit.json");
  EXPECT_EQ(after_exit.kernels.size(), static_cast<size_t>(2 * kKernelsPerIteration));
  ASSERT_TRUE(after_exit.exit_code.has_value());
  EXPECT_EQ(*after_exit.exit_code, 3);

  auto aborting = command;
  aborting.push_back("--abort");
  const CommandResult aborted = profile(dir / "abort.json", {}, aborting);
  EXPECT_EQ(aborted.exit_code, 128 + SIGABRT) << aborted.output;
  const Profile after_abort = read_profile(dir / "abort.json");
  EXPECT_EQ(after_abort.kernels.size(), static_cast<size_t>(2 * kKernelsPerIteration));
  const auto processes = after_abort.metadata.at("cupti").at("processes");
  ASSERT_EQ(processes.size(), 1u);
  EXPECT_EQ(processes[0].at("written_at"), "signal " + std::to_string(SIGABRT));
}

TEST_F(ProfileGpuTest, EachProcessOfACommandIsRecorded) {
  const auto out = test::temp_dir("profile-gpu-two") / "p.json";
  const std::string run = example_binary() + " --iters 1 --warmup 0 --tokens 64";
  const CommandResult r =
      profile(out, {"--range", "step"}, {"sh", "-c", run + " & " + run + "; wait"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Profile p = read_profile(out);
  EXPECT_EQ(p.metadata.at("cupti").at("processes").size(), 2u);
  std::map<int64_t, int> kernels_by_pid;
  for (const auto& k : p.kernels)
    ++kernels_by_pid[k.pid];
  ASSERT_EQ(kernels_by_pid.size(), 2u);
  for (const auto& [pid, count] : kernels_by_pid)
    EXPECT_EQ(count, kKernelsPerIteration) << "process " << pid;
}

}  // namespace
}  // namespace kforge
