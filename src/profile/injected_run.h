// Running a command under the CUPTI injection library: the environment that makes the CUDA
// driver load libkforge_inject.so into every CUDA process of the command (and NVTX hand it its
// ranges, which it passes to CUPTI), and the child process itself, with the terminal passed
// through.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "core/process.h"

namespace kforge {

struct InjectionPaths {
  // libkforge_inject.so: CUDA_INJECTION64_PATH and NVTX_INJECTION64_PATH both name it.
  std::filesystem::path injection_library;
  // When set (`kforge profile --torch`): a directory holding kforge's sitecustomize.py
  // (torch_hooks.h), put first on PYTHONPATH with KFORGE_TORCH_HOOKS=1.
  std::filesystem::path python_directory;
};

// libkforge_inject.so in `directory` (where the kforge binary is). Throws Error when it is
// missing.
InjectionPaths find_injection_paths(const std::filesystem::path& directory);

// Runs `command` (searched on PATH) with the injection environment added to ours, raw files
// going to `raw_directory`, stdin, stdout and stderr shared with kforge. SIGINT, SIGTERM,
// SIGHUP and SIGQUIT sent to kforge are passed on to the command (a terminal's Ctrl-C reaches
// both directly). Returns how the command ended. Throws UsageError when the command cannot be
// started (not found, not executable).
ExitStatus run_injected(const std::vector<std::string>& command, const InjectionPaths& paths,
                        const std::filesystem::path& raw_directory);

// The environment variables run_injected sets.
std::vector<std::pair<std::string, std::string>> injection_environment(
    const InjectionPaths& paths, const std::filesystem::path& raw_directory);

}  // namespace kforge
