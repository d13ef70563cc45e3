// `kforge loop DIR` on the CPU backend, as an external agent or a person drives it: a submitted
// file is checked and logged, and an experiment a killed run left is evaluated again first.
#include <fstream>

#include <gtest/gtest.h>

#include "core/process.h"
#include "loop/journal.h"
#include "test_support.h"

namespace kforge {
namespace {
namespace fs = std::filesystem;

TEST(LoopCli, SubmitsAndResumesAnInterruptedExperiment) {
  const fs::path ws = test::temp_dir("loop-cli");
  const fs::path task = ws / "task-01-rmsnorm";
  fs::create_directories(task);
  std::ofstream(task / "task.json") << R"({"op": "rmsnorm", "shape": "256x512", "dtype": "f32"})";
  std::string wrong =
      test::read_text(fs::path(test::kernels_dir()) / "rmsnorm" / "rmsnorm_cpu.cpp");
  const std::string from = "const acc_t inv_rms = acc_t(1)";
  ASSERT_NE(wrong.find(from), std::string::npos);
  wrong.replace(wrong.find(from), from.size(), "const acc_t inv_rms = acc_t(1.01)");
  std::ofstream(ws / "wrong.cpp") << wrong;

  const auto loop = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {test::kforge_binary(), "loop", ws.string(), "--backend", "cpu",
                                     "--max-seconds",       "0.2"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_command(argv, std::chrono::minutes(5));
  };
  const CommandResult submitted =
      loop({"--submit", (ws / "wrong.cpp").string(), "--note", "scaled by 1.01"});
  ASSERT_TRUE(submitted.ok()) << submitted.output;
  EXPECT_NE(submitted.output.find("#1 WRONG"), std::string::npos) << submitted.output;

  {  // A run killed while evaluating experiment 2 leaves it pending.
    TaskJournal journal = TaskJournal::open(task);
    journal.begin(test::read_text(ws / "wrong.cpp"));
  }
  const CommandResult resumed = loop({});
  ASSERT_TRUE(resumed.ok()) << resumed.output;
  EXPECT_NE(resumed.output.find("evaluating experiment 2 again"), std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("#2 WRONG"), std::string::npos) << resumed.output;

  const TaskJournal journal = TaskJournal::open(task);
  ASSERT_EQ(journal.records().size(), 2u);
  EXPECT_EQ(journal.records()[0].note, "scaled by 1.01");
  EXPECT_EQ(journal.records()[1].note, "resumed");
  EXPECT_FALSE(journal.records()[1].kept);
  EXPECT_EQ(journal.records()[0].fields.value("failing_stage", ""), "smoke");
  EXPECT_EQ(test::read_text(journal.kernel_path()),
            test::read_text(fs::path(test::kernels_dir()) / "rmsnorm" / "rmsnorm_cpu.cpp"));

  const CommandResult no_workspace = run_command({test::kforge_binary(), "loop", "/nonexistent"});
  EXPECT_FALSE(no_workspace.ok());
  EXPECT_NE(no_workspace.output.find("not a workspace"), std::string::npos);
}

}  // namespace
}  // namespace kforge
