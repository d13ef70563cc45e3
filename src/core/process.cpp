#include "core/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"

extern char** environ;

namespace kforge {
namespace {

using Clock = std::chrono::steady_clock;

// The process groups kforge has running. A fixed array of atomics, so that a signal handler
// can read it: kill() is async-signal-safe, locks and allocation are not.
constexpr size_t kMaxGroups = 1024;
std::array<std::atomic<pid_t>, kMaxGroups> g_groups{};
// Held from a spawn until its group is registered, and while orphans are swept, so that a
// child just started is never taken for an orphan.
std::mutex g_spawn_mutex;

// Runs `spawn` on one thread that lasts as long as the process, and returns what it returns. A
// worker asks the kernel to kill it when its parent dies (PR_SET_PDEATHSIG, run/sandbox.h), and
// the parent there is the thread that spawned it: a child spawned from a thread that ends first
// (a device lane's, a std::async task's) would be killed with that thread.
int on_lasting_thread(const std::function<int()>& spawn) {
  struct Spawner {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::packaged_task<int()>> tasks;
    Spawner() {
      std::thread([this] {
        for (;;) {
          std::packaged_task<int()> task;
          {
            std::unique_lock lock(mutex);
            ready.wait(lock, [&] { return !tasks.empty(); });
            task = std::move(tasks.front());
            tasks.pop_front();
          }
          task();
        }
      }).detach();
    }
  };
  // Never destroyed: its thread runs until the process ends, past static destructors.
  static Spawner* const spawner = new Spawner();
  std::packaged_task<int()> task(spawn);
  std::future<int> result = task.get_future();
  {
    const std::lock_guard lock(spawner->mutex);
    spawner->tasks.push_back(std::move(task));
  }
  spawner->ready.notify_one();
  return result.get();
}

void register_group(pid_t pgid) {
  for (auto& slot : g_groups) {
    pid_t empty = 0;
    if (slot.compare_exchange_strong(empty, pgid)) return;
  }
  // More than kMaxGroups children at once: the group is still ended by its owner; only the
  // exit-time sweep misses it.
}

void unregister_group(pid_t pgid) {
  for (auto& slot : g_groups) {
    pid_t expected = pgid;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

bool is_registered(pid_t pid) {
  for (const auto& slot : g_groups) {
    if (slot.load() == pid) return true;
  }
  return false;
}

void kill_all_groups() noexcept {
  for (auto& slot : g_groups) {
    const pid_t pgid = slot.load();
    if (pgid > 0) ::kill(-pgid, SIGKILL);
  }
}

void on_fatal_signal(int sig) {
  kill_all_groups();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

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

int wait_for(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// Waits until `pid` has ended without reaping it: while it is a zombie its number cannot be
// reused, so its process group can still be ended safely by that number.
void wait_unreaped(pid_t pid) {
  siginfo_t info{};
  while (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
}

// Ends a group whose leader is still running or has ended but is not yet reaped (so that its
// number is not reused), then reaps the leader.
int end_group_and_reap(pid_t leader) {
  ::kill(-leader, SIGKILL);
  const int status = wait_for(leader);
  unregister_group(leader);
  return status;
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

// Spawn attributes that put the child in a new process group of its own.
class OwnGroup {
 public:
  OwnGroup() {
    posix_spawnattr_init(&attr_);
    posix_spawnattr_setflags(&attr_, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr_, 0);
  }
  ~OwnGroup() { posix_spawnattr_destroy(&attr_); }
  const posix_spawnattr_t* get() const { return &attr_; }

 private:
  posix_spawnattr_t attr_;
};

// Two distinct descriptor numbers in [100, 1000), different from every open descriptor of
// ours, so that the dup2 into the child cannot land on a descriptor the child inherits.
std::pair<int, int> pick_channel_fds() {
  std::random_device rd;
  std::uniform_int_distribution<int> pick(100, 999);
  const auto free_here = [](int fd) { return fcntl(fd, F_GETFD) < 0; };
  int in = pick(rd);
  while (!free_here(in))
    in = pick(rd);
  int out = pick(rd);
  while (out == in || !free_here(out))
    out = pick(rd);
  return {in, out};
}

}  // namespace

std::string ExitStatus::describe() const {
  if (exited) return fmt::format("exited with code {}", exit_code);
  if (signal != 0) return fmt::format("killed by signal {} ({})", signal, strsignal(signal));
  return "unknown exit";
}

void contain_child_processes() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
      struct sigaction action {};
      action.sa_handler = on_fatal_signal;
      sigemptyset(&action.sa_mask);
      sigaction(sig, &action, nullptr);
    }
    std::atexit([] { kill_all_groups(); });
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  });
}

void sweep_orphans() {
  const std::lock_guard lock(g_spawn_mutex);
  const pid_t self = getpid();
  DIR* proc = opendir("/proc");
  if (!proc) return;
  std::vector<pid_t> orphans;
  while (const dirent* entry = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string text;
    std::getline(stat, text);
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so parse from the
    // last ')'.
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(text.c_str() + close + 1, " %c %ld", &state, &ppid) != 2) continue;
    if (ppid == self && !is_registered(static_cast<pid_t>(pid))) {
      orphans.push_back(static_cast<pid_t>(pid));
    }
  }
  closedir(proc);
  for (const pid_t pid : orphans) {
    ::kill(pid, SIGKILL);
    wait_for(pid);
  }
}

namespace {

enum class ThreadState { live, gone, unknown };

// Whether thread `tid` of this process is still live: listed, and not yet exiting. The kernel
// sets PF_EXITING (field 9 of stat, the task's flags) when a thread starts to exit, before
// pthread_join can return for it; such a thread never runs user code again. Only a stat file
// that no longer exists means the thread is gone: any other failure (a candidate that used up
// the worker's descriptors, say) leaves the count unknown.
ThreadState thread_state(const char* tid) {
  constexpr unsigned kExitingFlag = 0x4;  // PF_EXITING, include/linux/sched.h
  const std::string path = fmt::format("/proc/self/task/{}/stat", tid);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH ? ThreadState::gone : ThreadState::unknown;
  std::string stat;
  char chunk[1024];
  ssize_t n = 0;
  while ((n = ::read(fd, chunk, sizeof chunk)) > 0)
    stat.append(chunk, static_cast<size_t>(n));
  const int read_error = n < 0 ? errno : 0;
  ::close(fd);
  if (read_error == ESRCH) return ThreadState::gone;  // exited between open and read
  if (read_error != 0) return ThreadState::unknown;
  // The name (field 2) is in parentheses and may hold anything, ')' and newlines too (a thread
  // names itself): the fields resume after the last ')' of the whole file.
  const size_t close = stat.rfind(')');
  char state = 0;
  int ppid = 0, group = 0, session = 0, tty = 0, tty_group = 0;
  unsigned flags = 0;
  if (close == std::string::npos ||
      std::sscanf(stat.c_str() + close + 1, " %c %d %d %d %d %d %u", &state, &ppid, &group,
                  &session, &tty, &tty_group, &flags) != 7) {
    return ThreadState::live;  // unreadable fields: counted, so that nothing running is missed
  }
  const bool exiting = (flags & kExitingFlag) != 0 || state == 'Z' || state == 'X';
  return exiting ? ThreadState::gone : ThreadState::live;
}

}  // namespace

int count_own_threads() {
  DIR* dir = opendir("/proc/self/task");
  if (!dir) return -1;
  int n = 0;
  bool known = true;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const ThreadState state = thread_state(e->d_name);
    n += state == ThreadState::live ? 1 : 0;
    known = known && state != ThreadState::unknown;
  }
  closedir(dir);
  return known ? n : -1;
}

std::optional<Channel> parse_channel(const std::string& text) {
  Channel c;
  if (std::sscanf(text.c_str(), "%d,%d", &c.in, &c.out) != 2 || c.in < 0 || c.out < 0 ||
      c.in == c.out) {
    return std::nullopt;
  }
  return c;
}

CommandResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  Pipe out;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out.write_end(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out.write_end(), STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  // Own process group, so a timeout (or Ctrl-C) ends the command's children too.
  const OwnGroup group;
  pid_t pid = -1;
  auto c_argv = to_c_argv(argv);
  int rc = 0;
  {
    const std::lock_guard lock(g_spawn_mutex);
    rc = posix_spawnp(&pid, c_argv[0], &actions, group.get(), c_argv.data(), environ);
    if (rc == 0) register_group(pid);
  }
  posix_spawn_file_actions_destroy(&actions);
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
  // Whatever the command left behind in its group goes with it.
  wait_unreaped(pid);
  const ExitStatus s = decode_status(end_group_and_reap(pid));
  result.exit_code = s.exited ? s.exit_code : -1;
  result.signal = result.timed_out ? 0 : s.signal;
  return result;
}

ChildProcess::ChildProcess(std::vector<std::string> argv, const std::string& log_path) {
  Pipe requests;
  Pipe replies;
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) throw Error(fmt::format("cannot open {}: {}", log_path, std::strerror(errno)));
  const auto [in_fd, out_fd] = pick_channel_fds();
  argv.push_back("--channel");
  argv.push_back(fmt::format("{},{}", in_fd, out_fd));

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDERR_FILENO);
  posix_spawn_file_actions_adddup2(&actions, requests.read_end(), in_fd);
  posix_spawn_file_actions_adddup2(&actions, replies.write_end(), out_fd);
  const OwnGroup group;
  auto c_argv = to_c_argv(argv);
  const int rc = on_lasting_thread([&] {
    const std::lock_guard lock(g_spawn_mutex);
    const int spawned =
        posix_spawn(&pid_, c_argv[0], &actions, group.get(), c_argv.data(), environ);
    if (spawned == 0) register_group(pid_);
    return spawned;
  });
  posix_spawn_file_actions_destroy(&actions);
  ::close(log_fd);
  if (rc != 0) throw Error(fmt::format("cannot start {}: {}", argv.at(0), std::strerror(rc)));
  to_child_ = requests.release_write();
  from_child_ = replies.release_read();
}

ChildProcess::~ChildProcess() {
  if (!status_) kill_and_wait();
  if (to_child_ >= 0) ::close(to_child_);
  if (from_child_ >= 0) ::close(from_child_);
}

bool ChildProcess::send_line(const std::string& line) {
  if (to_child_ < 0) return false;
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

bool ChildProcess::has_unread() {
  if (!buffer_.empty()) return true;
  pollfd pfd{from_child_, POLLIN, 0};
  return ::poll(&pfd, 1, 0) > 0 && (pfd.revents & POLLIN);
}

void ChildProcess::close_input() {
  if (to_child_ >= 0) ::close(std::exchange(to_child_, -1));
}

ExitStatus ChildProcess::kill_and_wait() {
  if (status_) return *status_;
  // The whole group: anything the child started without leaving the group goes too.
  status_ = decode_status(end_group_and_reap(pid_));
  return *status_;
}

std::optional<ExitStatus> ChildProcess::try_wait(std::chrono::milliseconds grace) {
  if (status_) return status_;
  const auto deadline = Clock::now() + grace;
  for (;;) {
    siginfo_t info{};
    info.si_pid = 0;
    if (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid_) {
      status_ = decode_status(end_group_and_reap(pid_));
      return status_;
    }
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::optional<std::string> find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (!path) return std::nullopt;
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::filesystem::path candidate = std::filesystem::path(dir) / name;
    if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return std::nullopt;
}

std::optional<std::string> find_python_with(const std::string& module) {
  static std::mutex mutex;
  static std::map<std::string, std::optional<std::string>> found;
  const std::lock_guard lock(mutex);
  if (const auto it = found.find(module); it != found.end()) return it->second;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("KFORGE_PYTHON"); env && *env) candidates.push_back(env);
  if (const auto on_path = find_on_path("python3")) candidates.push_back(*on_path);
  candidates.push_back("/usr/bin/python3");
  std::optional<std::string>& answer = found[module];
  for (const auto& python : candidates) {
    if (run_command({python, "-c", "import " + module}, std::chrono::seconds(60)).ok()) {
      answer = python.find('/') == std::string::npos ? find_on_path(python) : python;
      if (answer) break;
    }
  }
  return answer;
}

}  // namespace kforge
