#include "cli/profile_command.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/common.h"
#include "core/error.h"
#include "core/run_info.h"
#include "core/temp_directory.h"
#include "profile/cupti_import.h"
#include "profile/injected_run.h"
#include "profile/summary.h"
#include "profile/torch_hooks.h"

namespace kforge {
namespace fs = std::filesystem;

namespace {

// The shell's convention: 128 + N for a command ended by signal N.
int exit_code_of(const ExitStatus& status) {
  return status.exited ? status.exit_code : 128 + status.signal;
}

}  // namespace

CLI::App* add_profile_command(CLI::App& app, ProfileFlags& flags) {
  auto* cmd = app.add_subcommand(
      "profile", "Run a CUDA program unchanged and record every kernel it runs (CUPTI)");
  cmd->add_option("--out", flags.out, "Profile to write")->capture_default_str();
  cmd->add_option("--range", flags.range,
                  "Keep only kernels launched inside this NVTX range (e.g. one per iteration)");
  cmd->add_option("--skip", flags.skip,
                  "With --range: skip the range's first N occurrences in each process (warm-up)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--torch", flags.torch,
                "PyTorch programs: record every module call (class, name, operand sizes and "
                "dtypes) and every ATen op with its input sizes, without changing the program");
  cmd->add_flag("--keep-raw", flags.keep_raw,
                "Keep the per-process raw CUPTI records (the directory is printed)");
  add_torch_trace_options(cmd, flags.torch_trace);
  cmd->add_option("command", flags.command, "The command to profile and its arguments, after --");
  // Options the command meant for itself, given without "--": reported with the fix.
  cmd->allow_extras();
  cmd->final_callback([cmd, &flags] {
    for (const auto& argument : cmd->remaining()) {
      if (argument != "--") flags.unparsed.push_back(argument);  // CLI11 lists the "--" it saw
    }
  });
  cmd->footer("Example: kforge profile --range step --skip 2 -- python3 train.py --steps 10");
  return cmd;
}

int cmd_profile(const ProfileFlags& flags, const std::vector<std::string>& argv) {
  if (!flags.torch_trace.trace.empty()) {
    if (!flags.command.empty() || !flags.range.empty()) {
      throw UsageError(
          "profile: --torch-trace imports a recorded trace; it takes no command or --range");
    }
    TorchTraceFlags import = flags.torch_trace;
    import.out = flags.out;
    return cmd_import_torch_trace(import, argv);
  }
  if (!flags.unparsed.empty()) {
    throw UsageError(fmt::format(
        "profile: {} is not an option of kforge profile; put the command after \"--\": kforge "
        "profile [OPTIONS] -- COMMAND ARGS...",
        flags.unparsed.front()));
  }
  if (flags.command.empty()) {
    throw UsageError("profile: no command given (kforge profile [OPTIONS] -- COMMAND ARGS...)");
  }
  if (flags.skip > 0 && flags.range.empty()) throw UsageError("profile: --skip needs --range");
  InjectionPaths paths = find_injection_paths(fs::read_symlink("/proc/self/exe").parent_path());
  // Where the processes of one run write their raw files; removed afterwards unless kept.
  TempDirectory raw("kforge-profile");
  if (flags.keep_raw) raw.keep();
  if (flags.torch) {
    paths.python_directory = raw.path() / "python";
    write_torch_hooks(paths.python_directory);
  }
  progress_line(fmt::format("kforge profile: running {}", fmt::join(flags.command, " ")));
  const ExitStatus status = run_injected(flags.command, paths, raw.path());
  const int exit_code = exit_code_of(status);
  if (!status.exited || status.exit_code != 0) {
    progress_line(fmt::format("kforge profile: the command {}", status.describe()));
  }

  const std::vector<nlohmann::json> raw_files = read_raw_files(raw.path());
  if (raw_files.empty()) {
    // Without CUDA the driver never loads the injection library, so no process writes a file.
    progress_line(fmt::format(
        "kforge: no CUDA activity recorded: {} {} without initializing CUDA in any process, so "
        "there is no profile to write",
        flags.command.front(), status.describe()));
    return exit_code != 0 ? exit_code : 3;
  }
  AssembleOptions options;
  options.command = flags.command;
  options.exit_code = exit_code;
  options.range = flags.range;
  options.skip = flags.skip;
  Profile profile;
  try {
    profile = assemble_profile(raw_files, options);
  } catch (const Error&) {
    raw.keep();  // the run may have been long; its records stay for another try
    progress_line(fmt::format("kforge profile: raw records kept in {}", raw.path().string()));
    throw;
  }
  nlohmann::json metadata = run_metadata(argv);
  metadata["cupti"] = profile.metadata.at("cupti");
  profile.metadata = std::move(metadata);
  write_profile(profile, flags.out);

  fmt::print("\n{}", profile_summary(profile));
  fmt::print("\nwrote {}\n", flags.out);
  if (flags.keep_raw) fmt::print("raw records in {}\n", raw.path().string());
  return exit_code;
}

}  // namespace kforge
