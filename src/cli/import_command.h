// Import of a torch.profiler Chrome trace as a kforge profile: `kforge profile --torch-trace
// FILE --out OUT` (for now also `kforge import-torch-trace FILE --out OUT`). The importer is
// src/profile/torch_trace.h; this is its command line and summary.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "profile/torch_trace.h"

namespace kforge {

struct TorchTraceFlags {
  std::string trace;                 // the Chrome trace file
  std::string out = "profile.json";  // where the kforge profile goes
  size_t top = 10;                   // kernels listed in the summary
};

// Adds `--torch-trace FILE` to a command that has its own --out (kforge profile); the command
// runs cmd_import_torch_trace when flags.trace is set.
CLI::Option* add_torch_trace_options(CLI::App* cmd, TorchTraceFlags& flags);

// The standalone `kforge import-torch-trace FILE [--out OUT] [--top N]`.
CLI::App* add_import_torch_trace_command(CLI::App& app, TorchTraceFlags& flags);

// Reads the trace, writes the profile to flags.out and prints a summary on stdout.
int cmd_import_torch_trace(const TorchTraceFlags& flags, const std::vector<std::string>& argv);

// The summary: counts, kernel and busy time, how kernels were linked, the top kernels by
// total time with the op they were launched from.
void print_torch_trace_summary(const TorchTraceImport& import, const std::string& trace_name,
                               size_t top);

}  // namespace kforge
