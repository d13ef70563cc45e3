// KernelBench-format problems (docs/kernelbench.md) as loop tasks, and their fast_p score:
//
//   kforge task --kernelbench PROBLEM.py --workspace WS     one task, checked against the Model
//   kforge kernelbench DIR --workspace WS --propose SPEC    every problem in DIR: a task each,
//                                                           the loop with SPEC, then fast_p
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/common.h"
#include "loop/proposer.h"

namespace kforge {

struct TaskFlags {
  std::string kernelbench;  // a KernelBench-format problem file
  std::string workspace;
};

struct KernelBenchFlags {
  std::string problems;  // a folder of problem files
  std::string workspace;
  std::string propose;  // a loop proposer; scripted:DIR takes DIR/NAME's files for problem NAME
  MoveOnRules rules;
  double max_seconds = 1.0;  // timing cap per kernel per experiment, and per timed function
  std::string json_path;
  bool rescore = false;  // score every task again, not reusing a task's score.json
};

CLI::App* add_task_command(CLI::App& app, TaskFlags& flags, DeviceFlags& device);
int cmd_task(const TaskFlags& flags, const DeviceFlags& device);
CLI::App* add_kernelbench_command(CLI::App& app, KernelBenchFlags& flags, DeviceFlags& device);
int cmd_kernelbench(const KernelBenchFlags& flags, const DeviceFlags& device,
                    const std::vector<std::string>& argv);

}  // namespace kforge
