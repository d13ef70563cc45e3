// A task's brief: what whoever proposes the next experiment (an external agent, a person, the
// LLM proposer) needs to know, as Markdown. The op (its formula, tensors, problem and dtype), the
// device and its measured ceilings, where the best stands against its roofline bound, the kernel
// file to edit, the recent experiments with what failed and why (stage, first line of the
// detail, the compiler's first errors), how far the move-on rules are, and how to submit.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "device/ceilings.h"
#include "loop/experiment.h"
#include "loop/journal.h"
#include "loop/proposer.h"

namespace kforge {

struct BriefInputs {
  std::string task_name;
  const LoopTask& task;
  const Ceilings& ceilings;
  const std::filesystem::path& kernel_path;  // the best version: the file to edit
  const std::vector<ExperimentRecord>& history;
  const MoveOnRules& rules;
  std::string
      submit_command;  // how to submit, e.g. `kforge loop WS --submit ...` (empty: not said)
  size_t recent = 10;  // experiments listed, newest last
};

std::string task_brief(const BriefInputs& in);

}  // namespace kforge
