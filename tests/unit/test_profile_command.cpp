// `kforge profile` end to end without a GPU: the command's environment, exit codes and errors,
// and a profile assembled from a raw file that a stand-in command writes where the injection
// library would.
#include <gtest/gtest.h>

#include "core/process.h"
#include "profile/profile.h"
#include "test_support.h"

namespace kforge {
namespace {

CommandResult kforge_profile(std::vector<std::string> args) {
  args.insert(args.begin(), {test::kforge_binary(), "profile"});
  return run_command(args, std::chrono::minutes(2));
}

std::string sample_raw() {
  return test::test_data_dir() + "/profile/raw-sample.json";
}

// A command that checks the injection environment, then writes the sample raw file as its own,
// echoes its first argument and exits with code 4.
std::vector<std::string> stand_in_command() {
  return {"sh", "-c",
          "test -f \"$CUDA_INJECTION64_PATH\" && test -f \"$NVTX_INJECTION64_PATH\" && "
          "cp \"$0\" \"$KFORGE_PROFILE_DIR/raw-$$.json\" && echo \"arg: $1\"; exit 4",
          sample_raw(), "--range"};
}

TEST(ProfileCommandTest, AssemblesTheRawFilesOfTheCommand) {
  const auto out = test::temp_dir("profile-command") / "p.json";
  std::vector<std::string> args = {"--out", out.string(), "--"};
  for (const auto& a : stand_in_command())
    args.push_back(a);
  const CommandResult r = kforge_profile(args);
  EXPECT_EQ(r.exit_code, 4) << r.output;  // the command's code, after writing the profile
  EXPECT_NE(r.output.find("arg: --range"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("wrote " + out.string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rmsnorm_kernel"), std::string::npos) << r.output;
  const Profile p = read_profile(out);
  EXPECT_EQ(p.source, "cupti");
  ASSERT_TRUE(p.exit_code.has_value());
  EXPECT_EQ(*p.exit_code, 4);
  EXPECT_EQ(p.command.front(), "sh");
  ASSERT_EQ(p.kernels.size(), 4u);
  EXPECT_EQ(p.kernels[1].name, "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT");
  EXPECT_EQ(p.kernels[1].cluster_size, 2);
  ASSERT_EQ(p.kernels[1].context.size(), 2u);
  EXPECT_EQ(p.kernels[1].context[1].name,
            "aten::mm, seq = 1, op_id = 2, sizes = [[512, 1024], [1024, 1024]]");
  ASSERT_EQ(p.devices.size(), 1u);
  EXPECT_EQ(p.devices[0].sm_count, 132);
  EXPECT_EQ(p.transfers.size(), 1u);
  EXPECT_TRUE(p.metadata.contains("kforge_git_sha")) << p.metadata.dump();
  EXPECT_TRUE(p.metadata.contains("cupti")) << p.metadata.dump();
}

TEST(ProfileCommandTest, SelectsARegion) {
  const auto out = test::temp_dir("profile-region") / "p.json";
  std::vector<std::string> args = {"--out", out.string(), "--range", "step", "--skip", "1", "--"};
  for (const auto& a : stand_in_command())
    args.push_back(a);
  const CommandResult r = kforge_profile(args);
  EXPECT_EQ(r.exit_code, 4) << r.output;
  const Profile p = read_profile(out);
  ASSERT_EQ(p.kernels.size(), 2u);  // the second step's
  EXPECT_EQ(p.kernels[0].correlation, 21);
  EXPECT_EQ(p.kernels[1].correlation, 22);
  EXPECT_TRUE(p.transfers.empty());
  EXPECT_NE(p.region.find("1 of 2"), std::string::npos) << p.region;

  args[3] = "iteration";  // --range iteration: never marked
  const CommandResult unknown = kforge_profile(args);
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_NE(unknown.output.find("ranges seen: \"aten::mm"), std::string::npos) << unknown.output;
  EXPECT_NE(unknown.output.find("raw records kept in"), std::string::npos) << unknown.output;
}

TEST(ProfileCommandTest, SaysWhenNoProcessUsedCuda) {
  const CommandResult ok = kforge_profile({"--", "sh", "-c", "exit 0"});
  EXPECT_EQ(ok.exit_code, 3) << ok.output;
  EXPECT_NE(ok.output.find("no CUDA activity recorded"), std::string::npos) << ok.output;
  // A failing command's own exit code wins.
  const CommandResult failed = kforge_profile({"--", "sh", "-c", "exit 5"});
  EXPECT_EQ(failed.exit_code, 5) << failed.output;
  EXPECT_NE(failed.output.find("exited with code 5"), std::string::npos) << failed.output;
}

TEST(ProfileCommandTest, RejectsBadCommands) {
  const CommandResult none = kforge_profile({});
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("no command given"), std::string::npos) << none.output;
  const CommandResult missing = kforge_profile({"--", "kforge-no-such-command-here"});
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("command not found: kforge-no-such-command-here"),
            std::string::npos)
      << missing.output;
  const CommandResult skip = kforge_profile({"--skip", "2", "--", "true"});
  EXPECT_EQ(skip.exit_code, 2) << skip.output;
  EXPECT_NE(skip.output.find("--skip needs --range"), std::string::npos) << skip.output;
}

}  // namespace
}  // namespace kforge
