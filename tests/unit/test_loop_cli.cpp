// `kforge loop DIR` on the CPU backend, as an external agent or a person drives it: a submitted
// file is checked and logged, and an experiment a killed run left is evaluated again first.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/process.h"
#include "loop/journal.h"
#include "loop/proposer.h"
#include "test_support.h"

namespace kforge {
namespace {
namespace fs = std::filesystem;

// A workspace holding one task, rmsnorm 256x512 f32 (the CPU starter is its start); returns the
// task's folder.
fs::path rmsnorm_workspace(const fs::path& ws) {
  const fs::path task = ws / "task-01-rmsnorm";
  fs::create_directories(task);
  std::ofstream(task / "task.json") << R"({"op": "rmsnorm", "shape": "256x512", "dtype": "f32"})";
  return task;
}

// `kforge loop WS --backend cpu ARGS...`
CommandResult run_loop(const fs::path& ws, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {test::kforge_binary(), "loop", ws.string(), "--backend", "cpu"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, std::chrono::minutes(5));
}

TEST(LoopCli, SubmitsAndResumesAnInterruptedExperiment) {
  const fs::path ws = test::temp_dir("loop-cli");
  const fs::path task = rmsnorm_workspace(ws);
  std::string wrong =
      test::read_text(fs::path(test::kernels_dir()) / "rmsnorm" / "rmsnorm_cpu.cpp");
  const std::string from = "const acc_t inv_rms = acc_t(1)";
  ASSERT_NE(wrong.find(from), std::string::npos);
  wrong.replace(wrong.find(from), from.size(), "const acc_t inv_rms = acc_t(1.01)");
  std::ofstream(ws / "wrong.cpp") << wrong;

  const auto loop = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--max-seconds", "0.2"});
    return run_loop(ws, extra);
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

  {  // While another loop holds the workspace: a second loop is refused, --status still reads.
    const int fd = ::open((ws / ".loop.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX), 0);
    const std::string pid = std::to_string(::getpid()) + "\n";
    ASSERT_EQ(::pwrite(fd, pid.data(), pid.size(), 0), static_cast<ssize_t>(pid.size()));
    const CommandResult refused = loop({});
    EXPECT_FALSE(refused.ok());
    EXPECT_NE(refused.output.find("another kforge loop is working"), std::string::npos)
        << refused.output;
    const CommandResult status =
        run_command({test::kforge_binary(), "loop", ws.string(), "--status"});
    ASSERT_TRUE(status.ok()) << status.output;
    EXPECT_NE(status.output.find("a loop is running (pid " + std::to_string(::getpid()) + ")"),
              std::string::npos)
        << status.output;
    EXPECT_NE(status.output.find("last #2 WRONG"), std::string::npos) << status.output;
    ::close(fd);
  }
  const CommandResult status =
      run_command({test::kforge_binary(), "loop", ws.string(), "--status"});
  EXPECT_NE(status.output.find("no loop running"), std::string::npos) << status.output;

  const CommandResult no_workspace = run_command({test::kforge_binary(), "loop", "/nonexistent"});
  EXPECT_FALSE(no_workspace.ok());
  EXPECT_NE(no_workspace.output.find("not a workspace"), std::string::npos);
}

// `--propose scripted:DIR`: DIR's edits in name order, each an experiment with its note; the
// loop moves on after --max-reverts experiments in a row not kept, and a later run resumes the
// sequence where it stopped, to its end.
TEST(LoopCli, ScriptedProposerRunsItsEditsUntilAMoveOnRule) {
  const fs::path ws = test::temp_dir("loop-scripted");
  const fs::path task = rmsnorm_workspace(ws);
  const std::string starter =
      test::read_text(fs::path(test::kernels_dir()) / "rmsnorm" / "rmsnorm_cpu.cpp");
  const std::string at = "const acc_t inv_rms = acc_t(1)";
  ASSERT_NE(starter.find(at), std::string::npos);
  const auto edited = [&](const std::string& before, const std::string& replacement) {
    std::string s = starter;
    s.replace(s.find(at), at.size(), before + replacement);
    return s;
  };
  const fs::path edits = ws / "edits";
  fs::create_directories(edits);
  std::ofstream(edits / "1-wrong.cpp") << edited("", "const acc_t inv_rms = acc_t(1.01)");
  std::ofstream(edits / "1-wrong.cpp.note") << "scale by 1.01\n";
  std::ofstream(edits / "2-broken.cpp") << edited("this does not compile; ", at);
  std::ofstream(edits / "3-slower.cpp")
      << edited("for (volatile int spin = 0; spin < 4000; ++spin) {}\n", at);

  const auto loop = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(),
                 {"--max-seconds", "0.2", "--propose", "scripted:" + edits.string()});
    return run_loop(ws, extra);
  };
  const CommandResult first = loop({"--max-reverts", "2"});
  ASSERT_TRUE(first.ok()) << first.output;
  EXPECT_NE(first.output.find("#1 WRONG"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("#2 COMPILE_ERROR"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("moving on: 2 experiments in a row not kept"), std::string::npos)
      << first.output;
  EXPECT_EQ(first.output.find("#3"), std::string::npos) << first.output;

  // The agent protocol's brief: what failed and why, and how to submit.
  const CommandResult brief = run_loop(ws, {"--next"});
  ASSERT_TRUE(brief.ok()) << brief.output;
  for (const char* line : {"# Task task-01-rmsnorm: rmsnorm 256x512 f32", "- #1 WRONG (scripted)",
                           "failed at smoke:", "- #2 COMPILE_ERROR (scripted)", "compiler:",
                           "2 in a row not kept", "--task task-01-rmsnorm --submit FILE"})
    EXPECT_NE(brief.output.find(line), std::string::npos) << line << "\n" << brief.output;

  const CommandResult second = loop({"--max-reverts", "0"});
  ASSERT_TRUE(second.ok()) << second.output;
  EXPECT_NE(second.output.find("#3 REVERT"), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("the scripted proposer has no more proposals"), std::string::npos)
      << second.output;

  const TaskJournal journal = TaskJournal::open(task);
  ASSERT_EQ(journal.records().size(), 3u);
  EXPECT_EQ(journal.records()[0].note, "scale by 1.01");
  EXPECT_EQ(journal.records()[1].note, "2-broken.cpp");
  for (const ExperimentRecord& r : journal.records()) {
    EXPECT_EQ(r.proposer, "scripted");
    EXPECT_FALSE(r.kept);
  }
  EXPECT_EQ(test::read_text(journal.kernel_path()), starter);

  const CommandResult unknown = run_loop(ws, {"--propose", "oracle"});
  EXPECT_FALSE(unknown.ok());
  EXPECT_NE(unknown.output.find("no proposer named oracle"), std::string::npos) << unknown.output;
}

// `--propose tuner:exhaustive`: every point of the file's tunables is an experiment (the file
// with those defaults); the kept file's defaults are the best point's; a later run replays the
// journal through the search and has nothing left to propose.
TEST(LoopCli, TunerProposerSearchesTheFilesTunables) {
  const fs::path ws = test::temp_dir("loop-tuner");
  const fs::path task = rmsnorm_workspace(ws);
  const auto loop = [&] {
    return run_loop(ws, {"--max-seconds", "0.2", "--propose", "tuner:exhaustive", "--max-reverts",
                         "0", "--target-speedup", "0"});
  };
  const CommandResult first = loop();
  ASSERT_TRUE(first.ok()) << first.output;
  EXPECT_NE(first.output.find("the tuner proposer has no more proposals"), std::string::npos)
      << first.output;

  TaskJournal journal = TaskJournal::open(task);
  ASSERT_EQ(journal.records().size(), 4u);  // UNROLL in {1, 2, 4, 8}
  std::string kept_unroll = "4";            // the starter's default
  for (size_t i = 0; i < 4; ++i) {
    const ExperimentRecord& r = journal.records()[i];
    const std::string unroll = std::to_string(1 << i);
    EXPECT_EQ(r.note, "UNROLL=" + unroll);
    EXPECT_EQ(r.proposer, "tuner");
    EXPECT_TRUE(r.verdict == "KEEP" || r.verdict == "REVERT" || r.verdict == "UNCHANGED")
        << r.verdict;  // UNCHANGED: the point the file stands on
    if (r.kept) kept_unroll = unroll;
  }
  EXPECT_NE(test::read_text(journal.kernel_path()).find("param: UNROLL = " + kept_unroll + " in"),
            std::string::npos);

  const CommandResult again = loop();
  ASSERT_TRUE(again.ok()) << again.output;
  EXPECT_EQ(again.output.find("#5"), std::string::npos) << again.output;
  EXPECT_EQ(TaskJournal::open(task).records().size(), 4u);
}

ExperimentRecord outcome(bool kept) {
  ExperimentRecord r;
  r.kept = kept;
  r.verdict = kept ? "KEEP" : "REVERT";
  return r;
}

TEST(MoveOnRules, EachRuleFiresAtItsThresholdAndZeroTurnsItOff) {
  MoveOnRules rules;  // 5 reverts, 2x, 90% of the roofline, no time budget
  std::vector<ExperimentRecord> history = {outcome(true), outcome(false), outcome(false),
                                           outcome(false), outcome(false)};
  EXPECT_EQ(move_on_reason(rules, history, 1.5, 0.5, 100), "");
  history.push_back(outcome(false));
  EXPECT_EQ(move_on_reason(rules, history, 1.5, 0.5, 100), "5 experiments in a row not kept");
  history.push_back(outcome(true));
  EXPECT_EQ(move_on_reason(rules, history, 1.5, 0.5, 100), "");
  EXPECT_NE(move_on_reason(rules, history, 2.0, 0.5, 100).find("2.00x the start"),
            std::string::npos);
  EXPECT_NE(move_on_reason(rules, history, 1.5, 0.9, 100).find("90% of its roofline bound"),
            std::string::npos);
  rules.budget_seconds = 60;
  EXPECT_NE(move_on_reason(rules, history, 1.5, 0.5, 60).find("time budget (60 s)"),
            std::string::npos);
  rules = {0, 0, 0, 0};
  history.assign(20, outcome(false));
  EXPECT_EQ(move_on_reason(rules, history, 9.0, 1.0, 1e9), "");
}

// A workspace of two small tasks: rmsnorm (whole-run gain 1.1) and softmax (1.6).
fs::path two_task_workspace(const std::string& name) {
  const fs::path ws = test::temp_dir(name);
  for (const auto& [folder, text] :
       {std::pair{"task-01-rmsnorm",
                  R"({"op": "rmsnorm", "shape": "64x256", "dtype": "f32", "gain": 1.1})"},
        std::pair{"task-02-softmax",
                  R"({"op": "softmax", "shape": "64x256", "dtype": "f32", "gain": 1.6})"}}) {
    fs::create_directories(ws / folder);
    std::ofstream(ws / folder / "task.json") << text;
  }
  return ws;
}

// With no --task, every task in the order of the plan's whole-run gain: here each moves on after
// its first timed experiment (any share of the roofline reaches --roofline 0.0001).
TEST(LoopCli, ProposerRunsEveryTaskInTheOrderOfItsGain) {
  const fs::path ws = two_task_workspace("loop-order");
  const CommandResult r =
      run_loop(ws, {"--max-seconds", "0.1", "--propose", "tuner", "--roofline", "0.0001"});
  ASSERT_TRUE(r.ok()) << r.output;
  const size_t softmax = r.output.find("[task-02-softmax] #1");
  const size_t rmsnorm = r.output.find("[task-01-rmsnorm] #1");
  ASSERT_NE(softmax, std::string::npos) << r.output;
  ASSERT_NE(rmsnorm, std::string::npos) << r.output;
  EXPECT_LT(softmax, rmsnorm) << r.output;
  EXPECT_EQ(r.output.find("#2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("moving on: the best is at"), std::string::npos) << r.output;

  const CommandResult scripted =
      run_loop(ws, {"--propose", "scripted:" + (ws / "task-01-rmsnorm").string()});
  EXPECT_FALSE(scripted.ok());
  EXPECT_NE(scripted.output.find("name its task with --task"), std::string::npos)
      << scripted.output;
}

// With --devices, tasks run side by side, one per device (CPU slots here): each task's
// experiments all ran on one device, the two tasks on two, and nothing is logged twice.
TEST(LoopCli, TasksRunSideBySideOnSeveralDevices) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs two CPU cores";
  const fs::path ws = two_task_workspace("loop-devices");
  const CommandResult r = run_loop(
      ws, {"--max-seconds", "0.1", "--propose", "tuner", "--max-reverts", "2", "--devices", "0,1"});
  ASSERT_TRUE(r.ok()) << r.output;
  std::set<std::string> lanes;
  for (const char* task : {"task-01-rmsnorm", "task-02-softmax"}) {
    const std::vector<ExperimentRecord> records = read_finished_experiments(ws / task);
    ASSERT_FALSE(records.empty()) << r.output;
    std::set<std::string> ran_on;
    std::set<int> numbers;
    for (const ExperimentRecord& e : records) {
      ran_on.insert(e.fields.value("ran_on", ""));
      numbers.insert(e.number);
    }
    EXPECT_EQ(ran_on.size(), 1u) << task << " moved between devices";
    EXPECT_EQ(numbers.size(), records.size()) << task << ": an experiment logged twice";
    lanes.insert(*ran_on.begin());
    EXPECT_NE(r.output.find(fmt::format("[{}] moving on", task)), std::string::npos) << r.output;
  }
  EXPECT_EQ(lanes, (std::set<std::string>{"cpu:0", "cpu:1"})) << r.output;
}

}  // namespace
}  // namespace kforge
