// Proposers: where a loop's experiments come from. Each is a small class registered by name in
// proposer.cpp (make_proposer), so a new one is added there and nowhere else.
//
//   scripted:DIR   DIR's files in name order, one experiment each: a fixed sequence of edits
//                  (the note is FILE.note's first line when there is one, else the file's name)
//   tuner[:S]      the template search of the task's file as a proposer: search strategy S
//                  (default local, as `kforge tune`) over the file's tunables, each point it
//                  proposes an experiment (the file with those defaults, noted "UNROLL=8
//                  VEC=4"), its cost the
//                  experiment's time
//   llm[:CONFIG]   an OpenAI-compatible chat model (src/loop/llm_proposer.h): the task's brief,
//                  the kernel file and docs/playbook.md in, a whole file or a unified diff out
//
// A proposer sees the task, its kernel file as it is now (the best so far) and every finished
// experiment; it returns the next version of the file, or nothing when it has no more.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/backend.h"
#include "device/ceilings.h"
#include "loop/experiment.h"
#include "loop/journal.h"

namespace kforge {

// When a task's loop moves on to the next task (AutoKernel's rules, all configurable).
struct MoveOnRules {
  int max_consecutive_reverts = 5;  // experiments in a row not kept (any verdict but KEEP)
  double target_speedup = 2.0;      // the best against the start
  double roofline_fraction = 0.9;   // the best's share of the roofline bound (timing_json)
  double budget_seconds = 0;        // the task's wall time in this run (0: none)
};

struct ProposalContext {
  const std::string& task_name;  // the task's folder name
  const LoopTask& task;
  const DeviceInfo& device;
  const Ceilings& ceilings;
  const MoveOnRules& rules;
  const std::filesystem::path& kernel_path;      // the task's kernel file (its name, backend)
  const std::string& current;                    // the task's kernel file now (its best)
  const std::vector<ExperimentRecord>& history;  // finished experiments, oldest first
  const ProgressFn& progress;                    // lines for a person following the loop
};

struct Proposal {
  std::string source;  // the whole new kernel file; with a failure, what was received instead
  std::string note;    // one line: what changed
  // A proposal that came to nothing to evaluate (a reply with no file, or none at all): the
  // experiment is logged with this verdict ("BAD_REPLY", "NO_REPLY") and `failure` as its detail.
  std::string failure_verdict;
  std::string failure;
  nlohmann::json fields = nlohmann::json::object();  // for the record: tokens, cost, model...
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual std::string_view name() const = 0;
  // The next proposal, or nullopt when there is nothing more to propose. One proposer serves
  // the tasks of a run one after another; it sees which task from the context.
  virtual std::optional<Proposal> next(const ProposalContext& context) = 0;
  // Why next() returned nothing, to finish "the NAME proposer ..." (e.g. "has spent its budget").
  virtual std::string why_done() const { return "has no more proposals"; }
};

// "NAME" or "NAME:ARGUMENT"; UsageError for an unknown name or a bad argument.
std::unique_ptr<Proposer> make_proposer(const std::string& spec);
std::vector<std::string> proposer_names();

// Why the loop should leave the task now ("5 experiments in a row not kept", ...), or empty.
// `history`: the experiments the reverts rule counts (the loop passes this run's).
// `best_roofline`: the best's share of its roofline bound (0: unknown).
std::string move_on_reason(const MoveOnRules& rules, const std::vector<ExperimentRecord>& history,
                           double best_speedup, double best_roofline, double elapsed_seconds);

}  // namespace kforge
