// `kforge tune OP|FILE`: template search under the device's limits (see src/tune/tuner.h).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/common.h"

namespace kforge {

struct TuneFlags {
  std::string target;             // an op, ops joined by commas, "all", or a kernel file
  std::vector<std::string> also;  // more kernel files of the same op, searched together
  std::string task;               // a task file `kforge plan --extract` wrote: op, shape and dtype
  std::string shape;
  std::string sizes;  // "all": every size of the op's benchmark sweep
  std::string dtype;  // default bf16, or the task's
  std::string strategy = "local";
  std::string budget;              // "N" evaluations or "P%" of the feasible space
  std::vector<std::string> fixed;  // NAME=VALUE tunables held at one value
  double max_seconds = 0;
  uint64_t seed = 0;
  size_t lookahead = 16;
  unsigned jobs = 0;
  std::string devices;  // "0,1" or "all": one worker per device; empty: --device alone
  std::string arch;
  std::string db;
  bool replay = false;
  std::string replay_device;
  bool fresh = false;
  bool no_final_check = false;
  size_t top = 10;
  std::string json_path;
  std::string table_path;
  bool update_table = false;  // with --shape: merge this size's row into the table
  std::string adopt;          // a device key or a table file: evaluate its rows' variants only
  bool no_starts = false;     // do not start from the rows of existing tables
  bool all_rows = false;      // start from every row of those tables, not only the nearest
  std::vector<std::string> starts;        // FILE:NAME=V,NAME=V points to evaluate first
  std::vector<std::string> check_dtypes;  // with --sizes all: check the table in these too
};

CLI::App* add_tune_command(CLI::App& app, TuneFlags& flags, DeviceFlags& device);
int cmd_tune(const TuneFlags& flags, const DeviceFlags& device,
             const std::vector<std::string>& argv);

}  // namespace kforge
