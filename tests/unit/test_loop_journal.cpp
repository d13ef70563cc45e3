// The loop's task journal: kept experiments are commits, reverts leave the tree as it was, both
// logs get every finished experiment once, and a kill at any step (simulated step by step, then
// real SIGKILLs at random moments) loses no finished experiment.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/json_file.h"
#include "core/process.h"
#include "loop/journal.h"
#include "test_support.h"

namespace kforge {
namespace {
namespace fs = std::filesystem;

using test::read_text;

std::vector<std::string> lines(const fs::path& path) {
  std::vector<std::string> out;
  std::istringstream in(read_text(path));
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

std::string git(const fs::path& repo, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"git", "-C", repo.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  const CommandResult r = run_command(argv);
  EXPECT_TRUE(r.ok()) << r.output;
  return r.output;
}

// A task folder with a one-line kernel file "v0".
fs::path new_task(const std::string& name) {
  const fs::path dir = test::temp_dir("journal-" + name);
  std::ofstream(dir / "start.cpp") << "v0\n";
  return dir;
}

ExperimentRecord outcome(bool kept, const std::string& note) {
  ExperimentRecord r;
  r.kept = kept;
  r.verdict = kept ? "KEEP" : "REVERT";
  r.proposer = "test";
  r.note = note;
  r.time_us = kept ? 90 : 110;
  return r;
}

// Every invariant of a journal at rest: records numbered 1..n, each kept one a commit whose
// subject names it, the logs in step, the repository clean and holding the last kept proposal.
void expect_consistent(const fs::path& task) {
  const TaskJournal j = TaskJournal::open(task / "task");
  const auto& records = j.records();
  for (size_t i = 0; i < records.size(); ++i)
    EXPECT_EQ(records[i].number, static_cast<int>(i) + 1);
  EXPECT_EQ(lines(task / "task" / "results.tsv").size(), records.size() + 1);
  EXPECT_EQ(lines(task / "task" / "experiments.jsonl").size(), records.size());
  const fs::path repo = task / "task" / "repo";
  EXPECT_EQ(git(repo, {"status", "--porcelain"}), "");
  size_t kept = 0;
  std::string last_kept = "v0\n";
  for (const auto& r : records) {
    if (!r.kept) continue;
    ++kept;
    EXPECT_NE(git(repo, {"log", "-1", "--format=%s", r.commit})
                  .find(fmt::format("experiment {}:", r.number)),
              std::string::npos);
    last_kept =
        read_text(task / "task" / "experiments" / fmt::format("{:04d}", r.number) / "proposal.cpp");
  }
  EXPECT_EQ(std::stoul(git(repo, {"rev-list", "--count", "HEAD"})), kept + 1);
  if (!j.interrupted()) EXPECT_EQ(read_text(j.kernel_path()), last_kept);
}

TEST(TaskJournal, KeepCommitsAndRevertLeavesTheTree) {
  const fs::path task = new_task("keep");
  TaskJournal j = TaskJournal::open(task / "task", task / "start.cpp");
  const std::string start = j.head();
  const fs::path p1 = j.begin("v1\n");
  EXPECT_EQ(read_text(j.kernel_path()), "v0\n");  // evaluated from the proposal, not the repo
  const ExperimentRecord kept = j.finish(outcome(true, "faster"));
  EXPECT_EQ(read_text(j.kernel_path()), "v1\n");
  EXPECT_NE(kept.commit, start);
  EXPECT_EQ(kept.commit, j.head());
  j.begin("v2 broken\n");
  const ExperimentRecord reverted = j.finish(outcome(false, "slower"));
  EXPECT_EQ(read_text(j.kernel_path()), "v1\n");
  EXPECT_EQ(reverted.commit, kept.commit);  // measured against the best so far
  EXPECT_EQ(j.records().size(), 2u);
  const auto tsv = lines(task / "task" / "results.tsv");
  ASSERT_EQ(tsv.size(), 3u);
  EXPECT_EQ(tsv[0].rfind("experiment\tcommit\tstatus", 0), 0u) << tsv[0];
  EXPECT_EQ(tsv[2].rfind("2\t", 0), 0u) << tsv[2];
  EXPECT_NE(tsv[2].find("REVERT"), std::string::npos);
  EXPECT_THROW(j.finish(outcome(true, "nothing pending")), Error);
  expect_consistent(task);
}

TEST(TaskJournal, ResumesFromEveryStepAKillCanInterrupt) {
  // 1. Killed while evaluating: the proposal comes back to be evaluated again.
  const fs::path a = new_task("interrupted");
  {
    TaskJournal j = TaskJournal::open(a / "task", a / "start.cpp");
    j.begin("v1\n", "scripted", "unroll by 2");
  }
  {
    TaskJournal j = TaskJournal::open(a / "task");
    ASSERT_TRUE(j.interrupted());
    EXPECT_EQ(read_text(*j.interrupted()), "v1\n");
    EXPECT_EQ(j.interrupted_origin().proposer, "scripted");  // kept for the resume's record
    EXPECT_EQ(j.interrupted_origin().note, "unroll by 2");
    EXPECT_THROW(j.begin("v2\n"), Error);
    j.finish(outcome(true, "again"));
    EXPECT_FALSE(j.interrupted());
  }
  expect_consistent(a);

  // The state finish() leaves once it has written experiment 1's kept record, and nothing more.
  const auto recorded_only = [](const fs::path& task) {
    TaskJournal j = TaskJournal::open(task / "task", task / "start.cpp");
    const fs::path proposal = j.begin("v1\n");
    ExperimentRecord r = outcome(true, "recorded");
    r.number = 1;
    write_json_atomically(proposal.parent_path() / "record.json", r.to_json());
    return std::pair{j.kernel_path(), proposal};
  };

  // 2. Killed after the record, before the commit: committed once on reopening.
  const fs::path b = new_task("recorded");
  recorded_only(b);
  expect_consistent(b);
  EXPECT_EQ(TaskJournal::open(b / "task").records().size(), 1u);

  // 3. Killed after the commit, before the logs: no second commit, logged once.
  const fs::path c = new_task("committed");
  {
    const auto [kernel, proposal] = recorded_only(c);
    fs::copy_file(proposal, kernel, fs::copy_options::overwrite_existing);
    git(c / "task" / "repo", {"commit", "-q", "-am", "experiment 1: committed (KEEP)"});
  }
  expect_consistent(c);

  // 4. Killed between the two logs, and with a torn line: each log ends with the record once.
  const fs::path d = new_task("logged");
  {
    TaskJournal j = TaskJournal::open(d / "task", d / "start.cpp");
    j.begin("v1\n");
    j.finish(outcome(false, "slower"));
    j.begin("v2\n");
    j.finish(outcome(true, "faster"));
  }
  {
    const fs::path tsv = d / "task" / "results.tsv";
    auto kept_lines = lines(tsv);
    kept_lines.pop_back();  // the TSV line of experiment 2 never written
    std::ofstream out(tsv, std::ios::trunc);
    for (const auto& l : kept_lines)
      out << l << "\n";
    out << "2\tabc";  // ... but a torn start of it was
    write_json_atomically(d / "task" / "pending.json", {{"experiment", 2}});
    std::ofstream(d / "task" / "experiments.jsonl", std::ios::app) << "{\"experiment\": 3, \"ver";
  }
  expect_consistent(d);
  EXPECT_EQ(TaskJournal::open(d / "task").records().size(), 2u);
}

// Real kills: a child process runs experiments (every third kept) and is killed with SIGKILL at
// random moments; after each kill the journal reopens consistent and the next child goes on
// from where it stopped.
TEST(TaskJournal, SurvivesSigkillAtRandomMoments) {
  const fs::path task = new_task("sigkill");
  TaskJournal::open(task / "task", task / "start.cpp");
  std::mt19937 random(20261124);
  size_t before = 0;
  int kills = 0;
  int mid_experiment = 0;  // kills that left an experiment under way
  for (int round = 0; round < 6; ++round) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        TaskJournal j = TaskJournal::open(task / "task");
        for (int i = 0; i < 1000; ++i) {
          if (!j.interrupted()) {
            j.begin(fmt::format("v{}\n", j.records().size() + 1));
          }
          const int next = static_cast<int>(j.records().size()) + 1;
          j.finish(outcome(next % 3 == 0, fmt::format("experiment {}", next)));
        }
      } catch (...) {
        _exit(2);
      }
      _exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + random() % 400));
    kills += kill(child, SIGKILL) == 0;
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0))
        << "the child failed on its own (status " << status << ")";
    mid_experiment += fs::exists(task / "task" / "pending.json");
    expect_consistent(task);
    const size_t after = TaskJournal::open(task / "task").records().size();
    EXPECT_GE(after, before);
    before = after;
  }
  EXPECT_GE(kills, 3);
  EXPECT_GE(mid_experiment, 1) << "no kill landed inside an experiment";
  EXPECT_GT(before, 5u) << "too few experiments finished to mean anything";
}

}  // namespace
}  // namespace kforge
