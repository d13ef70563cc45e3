#include "core/process.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"

extern char** environ;

namespace kforge {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<char*> to_c_argv(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const auto& a : argv)
    out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

ExitStatus decode_status(int status) {
  ExitStatus s;
  if (WIFEXITED(status)) {
    s.exited = true;
    s.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    s.signal = WTERMSIG(status);
  }
  return s;
}

class Pipe {
 public:
  Pipe() {
    if (pipe2(fds_, O_CLOEXEC) != 0) throw Error(fmt::format("pipe: {}", std::strerror(errno)));
  }
  ~Pipe() {
    close_read();
    close_write();
  }
  int read_end() const { return fds_[0]; }
  int write_end() const { return fds_[1]; }
  int release_read() { return std::exchange(fds_[0], -1); }
  int release_write() { return std::exchange(fds_[1], -1); }
  void close_read() {
    if (fds_[0] >= 0) ::close(std::exchange(fds_[0], -1));
  }
  void close_write() {
    if (fds_[1] >= 0) ::close(std::exchange(fds_[1], -1));
  }

 private:
  int fds_[2] = {-1, -1};
};

}  // namespace

std::string ExitStatus::describe() const {
  if (exited) return fmt::format("exited with code {}", exit_code);
  if (signal != 0) return fmt::format("killed by signal {} ({})", signal, strsignal(signal));
  return "unknown exit";
}

CommandResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  Pipe out;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out.write_end(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out.write_end(), STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Own process group, so a timeout kills the compiler's children too.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  auto c_argv = to_c_argv(argv);
  const int rc = posix_spawnp(&pid, c_argv[0], &actions, &attr, c_argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw Error(fmt::format("cannot run {}: {}", argv.at(0), std::strerror(rc)));
  out.close_write();

  CommandResult result;
  const auto deadline = Clock::now() + timeout;
  char buf[8192];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      result.timed_out = true;
      ::kill(-pid, SIGKILL);
      break;
    }
    pollfd pfd{out.read_end(), POLLIN, 0};
    const int n = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    const ssize_t got = ::read(out.read_end(), buf, sizeof buf);
    if (got <= 0) break;
    result.output.append(buf, static_cast<size_t>(got));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const ExitStatus s = decode_status(status);
  result.exit_code = s.exited ? s.exit_code : -1;
  result.signal = result.timed_out ? 0 : s.signal;
  return result;
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& log_path) {
  Pipe requests;
  Pipe responses;
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) throw Error(fmt::format("cannot open {}: {}", log_path, std::strerror(errno)));

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, requests.read_end(), STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDERR_FILENO);
  posix_spawn_file_actions_adddup2(&actions, responses.write_end(), kResponseFd);
  auto c_argv = to_c_argv(argv);
  const int rc = posix_spawn(&pid_, c_argv[0], &actions, nullptr, c_argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(log_fd);
  if (rc != 0) throw Error(fmt::format("cannot start {}: {}", argv.at(0), std::strerror(rc)));
  to_child_ = requests.release_write();
  from_child_ = responses.release_read();
}

ChildProcess::~ChildProcess() {
  if (!status_) kill_and_wait();
  if (to_child_ >= 0) ::close(to_child_);
  if (from_child_ >= 0) ::close(from_child_);
}

bool ChildProcess::send_line(const std::string& line) {
  std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    // MSG_NOSIGNAL does not apply to pipes; SIGPIPE is ignored by the CLI at startup.
    const ssize_t n = ::write(to_child_, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

std::optional<std::string> ChildProcess::receive_line(std::chrono::milliseconds timeout,
                                                      bool* timed_out) {
  *timed_out = false;
  const auto deadline = Clock::now() + timeout;
  char buf[65536];
  for (;;) {
    const auto newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      return line;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      *timed_out = true;
      return std::nullopt;
    }
    pollfd pfd{from_child_, POLLIN, 0};
    const int n = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (n < 0 && errno != EINTR) return std::nullopt;
    if (n <= 0) continue;
    const ssize_t got = ::read(from_child_, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return std::nullopt;  // child closed its end: it exited or crashed
    buffer_.append(buf, static_cast<size_t>(got));
  }
}

ExitStatus ChildProcess::kill_and_wait() {
  if (status_) return *status_;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  status_ = decode_status(status);
  return *status_;
}

std::optional<ExitStatus> ChildProcess::try_wait(std::chrono::milliseconds grace) {
  if (status_) return status_;
  const auto deadline = Clock::now() + grace;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      status_ = decode_status(status);
      return status_;
    }
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace kforge
