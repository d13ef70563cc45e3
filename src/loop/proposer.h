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

#include "device/backend.h"
#include "loop/experiment.h"
#include "loop/journal.h"

namespace kforge {

struct ProposalContext {
  const LoopTask& task;
  const DeviceInfo& device;
  const std::filesystem::path& kernel_path;      // the task's kernel file (its name, backend)
  const std::string& current;                    // the task's kernel file now (its best)
  const std::vector<ExperimentRecord>& history;  // finished experiments, oldest first
};

struct Proposal {
  std::string source;  // the whole new kernel file
  std::string note;    // one line: what changed
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual std::string_view name() const = 0;
  // The next proposal, or nullopt when there is nothing more to propose.
  virtual std::optional<Proposal> next(const ProposalContext& context) = 0;
};

// "NAME" or "NAME:ARGUMENT"; UsageError for an unknown name or a bad argument.
std::unique_ptr<Proposer> make_proposer(const std::string& spec);
std::vector<std::string> proposer_names();

// When a task's loop moves on to the next task (AutoKernel's rules, all configurable).
struct MoveOnRules {
  int max_consecutive_reverts = 5;  // experiments in a row not kept (any verdict but KEEP)
  double target_speedup = 2.0;      // the best against the start
  double roofline_fraction = 0.9;   // the best's share of the roofline bound (timing_json)
  double budget_seconds = 0;        // the task's wall time in this run (0: none)
};

// Why the loop should leave the task now ("5 experiments in a row not kept", ...), or empty.
// `best_roofline`: the best's share of its roofline bound (0: unknown).
std::string move_on_reason(const MoveOnRules& rules, const std::vector<ExperimentRecord>& history,
                           double best_speedup, double best_roofline, double elapsed_seconds);

}  // namespace kforge
