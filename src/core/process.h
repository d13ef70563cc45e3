// Child processes: one-shot commands with captured output (compilers), and long-lived
// children that talk over pipes (workers).
#pragma once

#include <sys/types.h>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace kforge {

struct CommandResult {
  int exit_code = -1;  // valid when !signaled and !timed_out
  int signal = 0;      // the signal that ended it, if any
  bool timed_out = false;
  std::string output;  // stdout and stderr, interleaved
  bool ok() const { return !timed_out && signal == 0 && exit_code == 0; }
};

// Runs argv[0] (searched on PATH) and waits for it, killing it after `timeout`.
CommandResult run_command(const std::vector<std::string>& argv,
                          std::chrono::milliseconds timeout = std::chrono::minutes(10));

// How a child process ended.
struct ExitStatus {
  bool exited = false;  // normal exit; code in exit_code
  int exit_code = 0;
  int signal = 0;  // killed by this signal
  std::string describe() const;
};

// A child that reads requests on its stdin and writes one-line responses on fd 3. Its stdout
// and stderr go to `log_path`, so whatever a kernel prints cannot corrupt the protocol.
class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const std::string& log_path);
  ~ChildProcess();  // kills the child if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Writes one line (a newline is appended). Returns false if the child is gone.
  bool send_line(const std::string& line);
  // Reads one line; nullopt on timeout or when the child closed its end (see exited()).
  std::optional<std::string> receive_line(std::chrono::milliseconds timeout, bool* timed_out);
  // Kills the child (SIGKILL) and reaps it.
  ExitStatus kill_and_wait();
  // Reaps the child if it has ended, waiting up to `grace`.
  std::optional<ExitStatus> try_wait(std::chrono::milliseconds grace);

 private:
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buffer_;
  std::optional<ExitStatus> status_;
};

// File descriptor the worker writes responses to.
inline constexpr int kResponseFd = 3;

}  // namespace kforge
