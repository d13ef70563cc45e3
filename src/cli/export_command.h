// `kforge export`: the library's tuned variants for a device, out of kforge in one of the export
// targets (src/export/): standalone CUDA sources, or (next) a PyTorch extension.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/common.h"

namespace kforge {

struct ExportFlags {
  std::vector<std::string> ops;  // op names, or "all" (every op with a table for the device)
  std::string target = "standalone";
  std::vector<std::string> dtypes;  // default: bf16, or the plan's
  std::string plan_path;            // `kforge plan --json`: the model's shapes
  std::vector<std::string> shapes;  // OP:SHAPE, e.g. rmsnorm:4096x4096
  bool no_table_sizes = false;      // only the plan's and --shape's sizes
  std::string workspace;            // a loop workspace: each task's kept best, at its size
  std::string ceilings_path;        // the device, for a machine without it
  std::string arch;
  std::string out;
};

struct VerifyFlags {
  std::string export_dir;         // a `kforge export --target torch` directory
  std::vector<std::string> args;  // passed on to kforge_ops.verify
};

struct PatchFlags {
  std::string export_dir;            // a `kforge export --target torch` directory
  std::string ops;                   // comma-separated; empty: every op the export has
  std::vector<std::string> command;  // the program to run
};

CLI::App* add_export_command(CLI::App& app, ExportFlags& flags, DeviceFlags& device);
CLI::App* add_verify_command(CLI::App& app, VerifyFlags& flags);
// Runs the export's kforge_ops.verify in Python (it needs PyTorch and a GPU) and returns its
// exit status.
[[noreturn]] int cmd_verify(const VerifyFlags& flags);
CLI::App* add_patch_command(CLI::App& app, PatchFlags& flags);
// Runs a program with the export's kforge_ops/_autopatch on PYTHONPATH: its models are patched
// at their first forward (kforge_ops/_autopatch/sitecustomize.py).
[[noreturn]] int cmd_patch(const PatchFlags& flags);
int cmd_export(const ExportFlags& flags, const DeviceFlags& device,
               const std::vector<std::string>& argv);

}  // namespace kforge
