// A loop workspace read as a whole: its task folders, and what each task's loop has come to,
// for the hand-off to `kforge export --workspace` (read only, safe beside a running loop).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "loop/experiment.h"

namespace kforge {

// The task folders of a workspace (those holding a task.json), in name order (the plan's rank);
// UsageError when there are none.
std::vector<std::filesystem::path> workspace_task_dirs(const std::filesystem::path& workspace);

// A task's best kernel file so far and how it stands against the task's start.
struct TaskBest {
  std::string name;  // the task folder's name
  LoopTask task;
  std::string device;            // the device the task was planned on, as task.json names it
  std::filesystem::path kernel;  // the repository's kernel file (the best so far)
  int experiments = 0;
  int kept = 0;
  double start_us = 0;
  double best_us = 0;
  double speedup = 1;
};

std::vector<TaskBest> workspace_bests(const std::filesystem::path& workspace);

}  // namespace kforge
