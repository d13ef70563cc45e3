// `kforge plan PROFILE`: rank a profile's kernels by what a kforge kernel could gain the whole run
// (see src/profile/planner.h), and extract the best as tasks for `kforge tune --task`.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace kforge {

struct PlanFlags {
  std::string profile;
  std::string ceilings;  // a `kforge ceilings --json` file; default: the cache, by device name
  std::string dtype = "bf16";
  size_t top = 20;
  std::string json_path;
  size_t extract = 0;
  std::string workspace;
  bool split_mlp = false;
};

CLI::App* add_plan_command(CLI::App& app, PlanFlags& flags);
int cmd_plan(const PlanFlags& flags, const std::vector<std::string>& argv);

}  // namespace kforge
