// One experiment's evaluation: a proposed kernel file checked in five stages, then timed against
// the task's current best in the same run, and the keep rule.
//
// The keep rule: the proposal passed every stage and its timing, and compare_aba()
// (bench/statistics.h) finds it FASTER by more than `min_gain` (1% by default, AutoKernel's
// threshold) than the best timed just before it and again just after it (A B A): both medians,
// beyond their standard errors and noise, and the fastest samples. The best is timed beside
// every proposal, so drift between experiments cannot pass for a gain, and on both sides of it,
// so drift within one cannot either; interference that slows both timings of the best shows in
// their medians but not in their fastest samples. A keep is confirmed by timing the proposal and
// the best once more (A B A B A) and applying the same rule to the second pair. A proposal
// identical to the best is UNCHANGED: timed once, never compared.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "check/checker.h"
#include "device/ceilings.h"
#include "loop/journal.h"
#include "ops/op_spec.h"
#include "run/protocol.h"
#include "run/worker_client.h"

namespace kforge {

// The problem a loop task optimizes.
struct LoopTask {
  const OpSpec* op = nullptr;
  Sizes sizes;  // completed
  DType dtype = DType::bf16;

  // From a task file's op, shape and dtype (`kforge plan --extract`); UsageError when invalid.
  static LoopTask from_json(const nlohmann::json& task);
};

struct EvaluationOptions {
  BenchSettings settings;  // for the proposal and the best alike
  double min_gain = 0.01;  // a kept proposal is faster than the best by more than this
};

// Evaluates `proposal` against `best` (the journal's current kernel file). The record's verdict
// is "KEEP", "REVERT" (correct, not faster by the rule), "UNCHANGED" (the best byte for byte),
// or the first failure: "BAD_FILE" (not a kernel file of the task's op, or a CUDA file defining
// code of its own with external linkage, which an export could not link beside the library's
// variants), or the check's or the timing's verdict ("COMPILE_ERROR", "WRONG", "CRASH",
// "TIMEOUT", "INVALID", ...). Its fields carry the failing stage and the failure, or both
// timings with their spreads and the comparison.
ExperimentRecord evaluate_proposal(Checker& checker, WorkerClient& worker, const Ceilings& ceilings,
                                   const LoopTask& task, const std::filesystem::path& proposal,
                                   const std::filesystem::path& best,
                                   const EvaluationOptions& options);

// A task's history (its finished experiments, oldest first) read for where it stands.
// The start's time, as timed beside the first experiment that was timed (0: none yet).
double start_us(const std::vector<ExperimentRecord>& history);
// The best time so far: the last kept experiment's, else the start's.
double best_us(const std::vector<ExperimentRecord>& history);
// best_us() against start_us() (1 until both are known).
double best_speedup(const std::vector<ExperimentRecord>& history);
// The best's latest timing (median_us, roofline_fraction, spreads...): the kept proposal's, or
// the best's as timed beside a later experiment; empty when not timed yet.
nlohmann::json best_timing(const std::vector<ExperimentRecord>& history);
// Experiments at the end of the history not kept (any verdict but KEEP).
int not_kept_in_a_row(const std::vector<ExperimentRecord>& history);

}  // namespace kforge
