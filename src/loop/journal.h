// One loop task on disk: a git repository holding its one kernel file, and the journal of its
// experiments, written so that a kill -9 at any moment loses no finished experiment.
//
//   TASK/task.json               the task (`kforge plan --extract`, or written by the loop)
//   TASK/repo/                   git repository: the kernel file; one commit per kept experiment
//   TASK/experiments/NNNN/       proposal (the file as proposed), record.json (its outcome)
//   TASK/experiments.jsonl       one record per finished experiment, in order
//   TASK/results.tsv             one line per finished experiment (columns: kResultsColumns)
//   TASK/pending.json            the experiment under way, if any
//
// An experiment: begin() saves the proposal and marks it pending; the caller evaluates the saved
// proposal (never the repository's file, so a revert has nothing to undo); finish() writes the
// record, commits the proposal when kept, appends to both logs and clears the mark. Each step is
// atomic (rename) or idempotent, so open() completes whatever a killed process left: a pending
// experiment whose record exists is finished again (committed once, logged once); one without a
// record was not evaluated to the end, and interrupted() returns its proposal to evaluate again.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kforge {

// What one experiment came to. `fields` holds the rest of the record (times and spreads,
// failing stage, mismatches, compiler log, resources, proposer's tokens and cost, and the diff
// of the proposal against the best, which finish() adds).
struct ExperimentRecord {
  int number = 0;
  std::string verdict;  // "KEEP", "REVERT", "COMPILE_ERROR", "WRONG", "CRASH", ...
  bool kept = false;
  std::string commit;    // the kept commit, or the commit the experiment was measured against
  std::string proposer;  // "agent", "llm", "tuner", ...
  std::string note;      // the proposer's one-line description
  double time_us = 0;    // median, when timed
  double speedup = 0;    // against the task's baseline, when timed
  nlohmann::json fields = nlohmann::json::object();

  nlohmann::json to_json() const;
  static ExperimentRecord from_json(const nlohmann::json& j);
};

// results.tsv's columns, in order.
inline constexpr const char* kResultsColumns[] = {
    "experiment", "commit", "status", "latency_us", "speedup", "proposer", "description"};

// Read-only views of a task folder, safe while a loop works on it (they change nothing, unlike
// TaskJournal::open, which completes what a killed process left): the finished experiments (a
// line still being written is left out), and the experiment under way (its pending.json), if any.
std::vector<ExperimentRecord> read_finished_experiments(const std::filesystem::path& task_dir);
std::optional<nlohmann::json> read_experiment_under_way(const std::filesystem::path& task_dir);

class TaskJournal {
 public:
  // Opens TASK, creating repo/ with `kernel_file` as its first commit when there is none yet
  // (`kernel_file` is then required), and completes what a killed process left (see above).
  static TaskJournal open(const std::filesystem::path& task_dir,
                          const std::filesystem::path& kernel_file = {});

  const std::filesystem::path& dir() const { return dir_; }
  // The repository's kernel file: the best version so far.
  std::filesystem::path kernel_path() const;
  // The repository's HEAD commit.
  std::string head() const;
  const std::vector<ExperimentRecord>& records() const { return records_; }
  // The proposal of an experiment a killed process did not finish, to evaluate again.
  std::optional<std::filesystem::path> interrupted() const;

  // Who proposed the interrupted experiment, why, and the proposer's fields for its record
  // (tokens, cost...), as begin() was told (empty when not told).
  struct Origin {
    std::string proposer;
    std::string note;
    nlohmann::json fields = nlohmann::json::object();
  };
  Origin interrupted_origin() const;

  // Saves `proposal` (the whole new kernel file) as the next experiment and marks it under way,
  // with its proposer, note and the proposer's fields for the record (kept for a resume). Returns
  // where it was saved; the experiment's number is records().size() + 1. An interrupted experiment
  // must be finished first.
  std::filesystem::path begin(const std::string& proposal, const std::string& proposer = {},
                              const std::string& note = {},
                              const nlohmann::json& fields = nlohmann::json::object());
  // Records the pending experiment's outcome. With record.kept the saved proposal becomes the
  // repository's file in a commit (record.commit is set to it); otherwise the repository is
  // untouched (record.commit is the commit it was measured against). Returns the record as
  // logged.
  ExperimentRecord finish(ExperimentRecord record);

 private:
  explicit TaskJournal(std::filesystem::path dir) : dir_(std::move(dir)) {}
  std::filesystem::path pending_path() const { return dir_ / "pending.json"; }
  std::filesystem::path experiment_dir(int number) const;
  std::filesystem::path proposal_path(int number) const;
  void recover();
  void complete(ExperimentRecord record);  // commit (once) and log (once), then clear pending
  void load_records();
  std::string proposal_diff(int number) const;  // the best against the proposal, unified

  std::filesystem::path dir_;
  std::string kernel_name_;  // the kernel file's name in repo/
  std::vector<ExperimentRecord> records_;
  int tsv_last_ = 0;  // the experiment on results.tsv's last line
  std::optional<int> interrupted_;
};

}  // namespace kforge
