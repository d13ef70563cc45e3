// The sanitizer stage: CUDA kernels run under NVIDIA's compute-sanitizer on small problems,
// once per tool, and every finding fails the stage. `kforge check --sanitize` runs memcheck,
// racecheck, synccheck and initcheck; a tuned winner must pass memcheck, racecheck and synccheck
// before it is recorded as checked. Small problems, because the tools slow kernels 10-100x.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace kforge {

// Every tool `kforge check --sanitize` runs, and the ones a tuned winner must pass.
const std::vector<std::string>& all_sanitizer_tools();
const std::vector<std::string>& winner_sanitizer_tools();
// "memcheck, racecheck and synccheck": tool names as a report's prose lists them.
std::string joined_tool_names(const std::vector<std::string>& tools);

// compute-sanitizer on PATH, or beside nvcc under the CUDA toolkit; nullopt when there is none.
std::optional<std::filesystem::path> find_compute_sanitizer();

// The worker launcher for one tool: compute-sanitizer with flags that make a finding fail the
// run and keep the report short.
std::vector<std::string> sanitizer_launcher(const std::filesystem::path& sanitizer,
                                            const std::string& tool);

// What one tool said, read from its output and the worker's exit.
struct SanitizerVerdict {
  bool clean = true;
  int errors = 0;       // "ERROR SUMMARY: N errors", or the hazards racecheck counts as errors
  std::string summary;  // the tool's findings, first lines
};
SanitizerVerdict read_sanitizer_output(const std::string& output, int exit_code);

}  // namespace kforge
