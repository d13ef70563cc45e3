#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "core/error.h"
#include "profile/profile.h"

namespace kforge {
namespace {

KernelRecord kernel(int64_t start, int64_t end, int64_t device = 0) {
  KernelRecord k;
  k.name = "_Z6kernelPf";
  k.demangled = "kernel(float*)";
  k.start_ns = start;
  k.end_ns = end;
  k.device = device;
  return k;
}

TEST(ProfileTest, BusyTimeIsTheUnionOfIntervalsPerDevice) {
  Profile p;
  p.kernels = {kernel(0, 100), kernel(50, 150), kernel(300, 400), kernel(0, 10, 1)};
  TransferRecord copy;
  copy.kind = "HtoD";
  copy.start_ns = 140;
  copy.end_ns = 200;
  p.transfers = {copy};
  EXPECT_EQ(p.kernel_time_ns(), 100 + 100 + 100 + 10);
  // Device 0: [0, 200) and [300, 400); device 1: [0, 10).
  EXPECT_EQ(p.busy_time_ns(), 200 + 100 + 10);
}

TEST(ProfileTest, RoundTripsThroughJsonFile) {
  Profile p;
  p.source = "cupti";
  p.command = {"python3", "llama.py"};
  p.exit_code = 1;
  p.region = "all";
  p.devices = {{0, "NVIDIA H200", 9, 0, 132}};
  KernelRecord k = kernel(5, 25);
  k.grid = {132, 1, 1};
  k.block = {256, 1, 1};
  k.registers = 40;
  k.context = {{"aten::linear", {}, {}}, {"aten::addmm", {{8, 512}, {512, 512}}, {"float"}}};
  p.kernels = {k};
  p.ranges = {{"step", 0, 50, 7, 1234, 0}};
  const auto path = std::filesystem::temp_directory_path() / "kforge-profile-roundtrip.json";
  write_profile(p, path);
  const Profile back = read_profile(path);
  std::filesystem::remove(path);
  EXPECT_EQ(back.source, "cupti");
  EXPECT_EQ(back.command, p.command);
  ASSERT_TRUE(back.exit_code.has_value());
  EXPECT_EQ(*back.exit_code, 1);
  EXPECT_EQ(back.devices, p.devices);
  ASSERT_EQ(back.kernels.size(), 1u);
  EXPECT_EQ(back.kernels[0].grid, k.grid);
  EXPECT_EQ(back.kernels[0].registers, 40);
  EXPECT_EQ(back.kernels[0].context, k.context);
  ASSERT_EQ(back.ranges.size(), 1u);
  EXPECT_EQ(back.ranges[0].name, "step");
  EXPECT_EQ(back.ranges[0].thread, 7);
}

TEST(ProfileTest, RejectsOtherFiles) {
  const auto path = std::filesystem::temp_directory_path() / "kforge-profile-not.json";
  {
    std::ofstream out(path);
    out << R"({"traceEvents": []})";
  }
  EXPECT_THROW(read_profile(path), UsageError);
  std::filesystem::remove(path);
  EXPECT_THROW(read_profile(path), UsageError);  // missing file
}

}  // namespace
}  // namespace kforge
