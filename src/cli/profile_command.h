// `kforge profile [--out FILE] [--range NAME --skip N] [--keep-raw] -- COMMAND ARGS...`: runs
// any CUDA program unchanged under the CUPTI injection library and writes one profile of every
// kernel its processes ran, with the NVTX ranges each was launched in (docs/profiling.md).
// With --torch, PyTorch programs also record their module calls and op shapes (torch_hooks.h).
// `kforge profile --torch-trace FILE [--out FILE]` imports a torch.profiler trace instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/import_command.h"

namespace kforge {

struct ProfileFlags {
  std::string out = "kforge-profile.json";
  std::string range;
  int64_t skip = 0;
  bool keep_raw = false;
  bool torch = false;  // --torch: kforge's PyTorch hooks in every Python process of the command
  std::vector<std::string> command;
  std::vector<std::string> unparsed;  // arguments that are neither kforge's options nor after --
  TorchTraceFlags torch_trace;        // --torch-trace FILE: import instead of running a command
};

CLI::App* add_profile_command(CLI::App& app, ProfileFlags& flags);
// Returns the command's exit code (128 + N when signal N ended it), also when it failed.
int cmd_profile(const ProfileFlags& flags, const std::vector<std::string>& argv);

}  // namespace kforge
