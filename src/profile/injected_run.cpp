#include "profile/injected_run.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"

extern char** environ;

namespace kforge {
namespace fs = std::filesystem;

namespace {

constexpr const char* kInjectionLibraryName = "libkforge_inject.so";

volatile sig_atomic_t child_pid = 0;  // the command while it runs, for the signal handler

void pass_signal_on(int signal_number, siginfo_t* info, void* /*context*/) {
  // A terminal's signals (Ctrl-C, Ctrl-\) go to the whole foreground process group, the
  // command included; passing them on would deliver them twice.
  if (info && info->si_code == SI_KERNEL) return;
  if (child_pid > 0) ::kill(child_pid, signal_number);
}

// Passes the signals on while it lives; restores the previous handlers after.
class SignalForwarding {
 public:
  SignalForwarding() {
    struct sigaction forward {};
    forward.sa_sigaction = pass_signal_on;
    forward.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&forward.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i)
      sigaction(kSignals[i], &forward, &previous_[i]);
  }
  ~SignalForwarding() {
    for (size_t i = 0; i < kSignals.size(); ++i)
      sigaction(kSignals[i], &previous_[i], nullptr);
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  static constexpr std::array<int, 4> kSignals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  std::array<struct sigaction, 4> previous_{};
};

}  // namespace

InjectionPaths find_injection_paths(const fs::path& directory) {
  InjectionPaths paths;
  paths.injection_library = directory / kInjectionLibraryName;
  if (!fs::exists(paths.injection_library)) {
    throw Error(
        fmt::format("{} is missing (it is built with kforge and must sit beside the kforge "
                    "binary)",
                    paths.injection_library.string()));
  }
  return paths;
}

std::vector<std::pair<std::string, std::string>> injection_environment(
    const InjectionPaths& paths, const fs::path& raw_directory) {
  std::vector<std::pair<std::string, std::string>> added = {
      {"CUDA_INJECTION64_PATH", paths.injection_library.string()},
      // The injection library forwards NVTX's initialization to the CUPTI that records
      // (InitializeInjectionNvtx2 in inject.cpp), whichever copy the program loaded.
      {"NVTX_INJECTION64_PATH", paths.injection_library.string()},
      {"KFORGE_PROFILE_DIR", raw_directory.string()}};
  if (!paths.python_directory.empty()) {
    std::string python_path = paths.python_directory.string();
    if (const char* user = std::getenv("PYTHONPATH"); user && *user)
      python_path += std::string(":") + user;
    added.emplace_back("PYTHONPATH", python_path);
    added.emplace_back("KFORGE_TORCH_HOOKS", "1");
  }
  return added;
}

ExitStatus run_injected(const std::vector<std::string>& command, const InjectionPaths& paths,
                        const fs::path& raw_directory) {
  if (command.empty()) throw UsageError("no command to profile");
  const auto added = injection_environment(paths, raw_directory);
  std::vector<std::string> environment;
  for (char** entry = environ; *entry; ++entry) {
    const std::string_view variable(*entry);
    const bool replaced = std::any_of(added.begin(), added.end(), [&](const auto& a) {
      return variable.starts_with(a.first + "=");
    });
    if (!replaced) environment.emplace_back(variable);
  }
  for (const auto& [name, value] : added)
    environment.push_back(name + "=" + value);

  std::vector<char*> argv;
  for (const auto& a : command)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : environment)
    envp.push_back(e.data());
  envp.push_back(nullptr);

  SignalForwarding forwarding;
  pid_t pid = 0;
  // posix_spawnp reports a command that cannot be executed as its result.
  const int spawn_error = posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data());
  if (spawn_error != 0) {
    if (spawn_error == ENOENT) throw UsageError(fmt::format("command not found: {}", command[0]));
    throw UsageError(fmt::format("cannot run {}: {}", command[0], std::strerror(spawn_error)));
  }
  child_pid = pid;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      child_pid = 0;
      throw Error(fmt::format("waiting for {}: {}", command[0], std::strerror(errno)));
    }
  }
  child_pid = 0;
  ExitStatus result;
  if (WIFEXITED(status)) {
    result.exited = true;
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  return result;
}

}  // namespace kforge
