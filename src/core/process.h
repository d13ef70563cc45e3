// Child processes: one-shot commands with captured output (compilers), and long-lived
// children that talk over a private channel (workers). Every child runs in a process group of
// its own, and every group kforge starts is ended when kforge exits, on Ctrl-C too.
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

// The first executable `name` in the folders of $PATH; nullopt when there is none.
std::optional<std::string> find_on_path(const std::string& name);
// A python3 that can import `module`, as a path: $KFORGE_PYTHON if set, else the first of
// python3 on PATH and the system's /usr/bin/python3 that can (a PATH python from a version
// manager may lack a Debian package); nullopt when none can. Asked once per module.
std::optional<std::string> find_python_with(const std::string& module);

// Runs argv[0] (searched on PATH) and waits for it, killing its whole group after `timeout`.
CommandResult run_command(const std::vector<std::string>& argv,
                          std::chrono::milliseconds timeout = std::chrono::minutes(10));

// How a child process ended.
struct ExitStatus {
  bool exited = false;  // normal exit; code in exit_code
  int exit_code = 0;
  int signal = 0;  // killed by this signal
  std::string describe() const;
};

// A child that reads one-line requests on one descriptor and writes one-line replies on
// another, both private to the channel: its stdin is /dev/null and its stdout and stderr go to
// `log_path`, so whatever code it runs reads or prints cannot reach the protocol. The two
// descriptor numbers are drawn at random and appended to argv as `--channel IN,OUT`.
class ChildProcess {
 public:
  ChildProcess(std::vector<std::string> argv, const std::string& log_path);
  ~ChildProcess();  // ends the child's group if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Writes one line (a newline is appended). Returns false if the child is gone.
  bool send_line(const std::string& line);
  // Reads one line; nullopt on timeout or when the child closed its end (see exited()).
  std::optional<std::string> receive_line(std::chrono::milliseconds timeout, bool* timed_out);
  // Whether the child wrote more than has been read (a poll that does not wait).
  bool has_unread();
  // Closes the request channel: a worker reading it sees the end and exits by itself.
  void close_input();
  // Kills the child's whole process group (SIGKILL) and reaps the child.
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

// The worker side of `--channel IN,OUT`.
struct Channel {
  int in = -1;
  int out = -1;
};
// Parses "IN,OUT"; nullopt when malformed.
std::optional<Channel> parse_channel(const std::string& text);

// Makes sure no process kforge started outlives it: SIGINT, SIGTERM, SIGHUP and SIGQUIT end
// every child process group before kforge itself ends, and so does a normal exit. kforge also
// becomes a subreaper, so that a grandchild whose parent died (a candidate's daemon, say) is
// reparented to kforge rather than to init, and sweep_orphans() can end it. Idempotent.
void contain_child_processes();
// Ends and reaps every process reparented to kforge that it did not start itself.
void sweep_orphans();
// Threads of the calling process that can still run its code (from /proc/self/task); -1 when
// that cannot be told (the folder or a thread's stat cannot be read). A thread that has begun to
// exit is not counted: a joined thread stays listed for a moment after pthread_join returns, and
// counting it would take a clean call that used threads of its own (or kforge's own parallel
// fill) for one that left work running.
int count_own_threads();

}  // namespace kforge
