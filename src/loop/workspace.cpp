#include "loop/workspace.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_file.h"
#include "loop/journal.h"

namespace kforge {
namespace fs = std::filesystem;

std::vector<fs::path> workspace_task_dirs(const fs::path& workspace) {
  if (!fs::is_directory(workspace)) {
    throw UsageError(fmt::format("{} is not a workspace directory", workspace.string()));
  }
  std::vector<fs::path> dirs;
  for (const auto& entry : fs::directory_iterator(workspace)) {
    if (entry.is_directory() && fs::exists(entry.path() / "task.json"))
      dirs.push_back(entry.path());
  }
  std::sort(dirs.begin(), dirs.end());
  if (dirs.empty()) {
    throw UsageError(
        fmt::format("{} has no task folders (task.json): make them with `kforge "
                    "plan PROFILE --extract N --workspace {}`",
                    workspace.string(), workspace.string()));
  }
  return dirs;
}

std::vector<TaskBest> workspace_bests(const fs::path& workspace) {
  std::vector<TaskBest> bests;
  for (const fs::path& dir : workspace_task_dirs(workspace)) {
    TaskBest b;
    b.name = dir.filename().string();
    const nlohmann::json task_file = read_json_file(dir / "task.json");
    b.task = LoopTask::from_json(task_file);
    b.device = task_file.value("device", "");
    // The repository's one kernel file (a task the loop never opened has none yet).
    if (fs::is_directory(dir / "repo")) {
      for (const auto& entry : fs::directory_iterator(dir / "repo")) {
        if (entry.is_regular_file() && entry.path().filename().string().front() != '.')
          b.kernel = entry.path();
      }
    }
    const std::vector<ExperimentRecord> records = read_finished_experiments(dir);
    b.experiments = static_cast<int>(records.size());
    b.kept = static_cast<int>(
        std::count_if(records.begin(), records.end(), [](const auto& r) { return r.kept; }));
    b.start_us = kforge::start_us(records);
    b.best_us = kforge::best_us(records);
    b.speedup = best_speedup(records);
    bests.push_back(std::move(b));
  }
  return bests;
}

}  // namespace kforge
