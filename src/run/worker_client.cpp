#include "run/worker_client.h"

#include <unistd.h>
#include <atomic>
#include <csignal>
#include <fstream>
#include <random>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "run/shared_region.h"

namespace kforge {
namespace fs = std::filesystem;

std::string_view verdict_name(Verdict v) {
  switch (v) {
    case Verdict::ok:
      return "OK";
    case Verdict::wrong:
      return "WRONG";
    case Verdict::crash:
      return "CRASH";
    case Verdict::timeout:
      return "TIMEOUT";
    case Verdict::oom:
      return "OOM";
    case Verdict::compile_error:
      return "COMPILE_ERROR";
    case Verdict::rejected:
      return "REJECTED";
    case Verdict::invalid:
      return "INVALID";
  }
  return "?";
}

std::optional<Verdict> parse_verdict(std::string_view name) {
  for (const Verdict v :
       {Verdict::ok, Verdict::wrong, Verdict::crash, Verdict::timeout, Verdict::oom,
        Verdict::compile_error, Verdict::rejected, Verdict::invalid}) {
    if (verdict_name(v) == name) return v;
  }
  return std::nullopt;
}

std::string truncate_middle(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  const size_t half = max_bytes / 2;
  return fmt::format("{}\n... [{} bytes left out] ...\n{}", text.substr(0, half),
                     text.size() - 2 * half, text.substr(text.size() - half));
}

WorkerClient::WorkerClient(WorkerOptions options) : options_(std::move(options)) {
  // A worker that dies while we write to it must not take kforge down with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  contain_child_processes();
  SharedRegion::remove_stale();
  if (options_.executable.empty()) options_.executable = fs::read_symlink("/proc/self/exe");
  if (options_.log_dir.empty()) {
    static std::atomic<int> clients{0};
    options_.log_dir =
        fs::temp_directory_path() / fmt::format("kforge-workers-{}-{}", getpid(), clients++);
    owns_log_dir_ = true;
  }
  fs::create_directories(options_.log_dir);
}

WorkerClient::~WorkerClient() {
  restart();
  if (owns_log_dir_) {
    std::error_code ec;
    fs::remove_all(options_.log_dir, ec);
  }
}

void WorkerClient::ensure_started() {
  if (child_) return;
  ++started_;
  log_path_ = options_.log_dir / fmt::format("worker-{}.log", started_);
  log_read_ = 0;
  ran_candidate_ = false;
  // Sequence numbers start where nobody can guess them, so a forged reply cannot carry one.
  std::random_device rd;
  sequence_ = ((uint64_t{rd()} << 32) ^ rd()) >> 2;
  std::vector<std::string> argv = options_.launcher;
  for (const std::string& a :
       {options_.executable.string(), std::string("__worker"), std::string("--backend"),
        options_.backend, std::string("--device"), std::to_string(options_.device),
        std::string("--parent"), std::to_string(getpid())}) {
    argv.push_back(a);
  }
  if (options_.cpu_core >= 0) {
    argv.push_back("--cpu-core");
    argv.push_back(std::to_string(options_.cpu_core));
  }
  child_ = std::make_unique<ChildProcess>(argv, log_path_.string());
  const WorkerReply hello = request({{"op", "hello"}}, options_.start_timeout);
  if (!hello.ok()) {
    restart();
    throw Error(fmt::format("the {} worker did not start ({}): {}", options_.backend, hello.detail,
                            log_tail()));
  }
  device_ = hello.body.at("device").get<DeviceInfo>();
  threads_at_start_ = hello.body.value("threads", -1);
}

const DeviceInfo& WorkerClient::device() {
  ensure_started();
  return *device_;
}

ExitStatus WorkerClient::end_worker(std::chrono::milliseconds grace) {
  std::optional<ExitStatus> status = child_->try_wait(grace);
  if (!status) status = child_->kill_and_wait();
  sweep_orphans();
  child_.reset();
  return *status;
}

void WorkerClient::restart() {
  if (child_) end_worker(std::chrono::milliseconds(0));
}

WorkerClient::Finish WorkerClient::finish() {
  if (!child_) return {};
  child_->close_input();
  const ExitStatus status = end_worker(std::chrono::minutes(2));
  return {take_output(), status};
}

std::string WorkerClient::log_tail(size_t max_bytes) const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  if (text.size() > max_bytes) text = "..." + text.substr(text.size() - max_bytes);
  return text;
}

std::string WorkerClient::take_output() {
  std::error_code ec;
  const auto end = static_cast<size_t>(fs::file_size(log_path_, ec));
  if (ec || end <= log_read_) return "";
  const size_t begin = std::exchange(log_read_, end);
  // Keep the head and the tail of what one request printed: a candidate may print gigabytes.
  constexpr size_t kKeep = 32 * 1024;
  std::ifstream in(log_path_, std::ios::binary);
  const auto read = [&](size_t from, size_t bytes) {
    std::string text(bytes, '\0');
    in.seekg(static_cast<std::streamoff>(from));
    in.read(text.data(), static_cast<std::streamsize>(bytes));
    text.resize(static_cast<size_t>(in.gcount()));
    return text;
  };
  if (end - begin <= 2 * kKeep) return read(begin, end - begin);
  return fmt::format("{}\n... [{} bytes left out] ...\n{}", read(begin, kKeep),
                     end - begin - 2 * kKeep, read(end - kKeep, kKeep));
}

WorkerReply WorkerClient::lost_worker(const std::string& what) {
  WorkerReply reply;
  reply.verdict = Verdict::crash;
  const ExitStatus status = end_worker(std::chrono::milliseconds(0));
  reply.detail = fmt::format("{}: worker {}", what, status.describe());
  if (status.signal == SIGSYS) {
    // The worker's fence ends a forbidden system call this way when it cannot refuse it
    // quietly (signals blocked, as around posix_spawn).
    reply.verdict = Verdict::invalid;
    reply.detail = fmt::format(
        "the kernel made a system call kernel files may not make (to start a process, run a "
        "program or signal another process); the worker was ended ({})",
        status.describe());
  }
  reply.output = take_output();
  return reply;
}

WorkerReply WorkerClient::request(const nlohmann::json& request,
                                  std::chrono::milliseconds timeout) {
  // A worker a candidate left threads in is replaced before other code runs there; replays
  // still go to it, since they belong to the measurement that left them.
  if (replace_before_next_ && request.value("op", "") != "replay") {
    restart();
    replace_before_next_ = false;
  }
  if (request.value("op", "") != "hello") ensure_started();
  if (request.contains("module") && !request.at("module").get<std::string>().empty()) {
    ran_candidate_ = true;
  }
  // The worker writes one line per request and nothing else: data waiting before a request
  // was written by someone else, and the last reply may not have been the worker's.
  if (child_->has_unread()) {
    return lost_worker(
        "the reply channel carried data nobody asked for (written by the candidate?)");
  }
  nlohmann::json message = request;
  message["seq"] = ++sequence_;
  if (!child_->send_line(message.dump())) return lost_worker("request not delivered");
  bool timed_out = false;
  const auto line = child_->receive_line(timeout, &timed_out);
  if (!line) {
    if (timed_out) {
      // A kernel that never ends cannot be interrupted from inside; killing the process frees
      // the device.
      end_worker(std::chrono::milliseconds(0));
      WorkerReply reply{Verdict::timeout,
                        {},
                        fmt::format("no answer within {:.1f} s; worker killed",
                                    static_cast<double>(timeout.count()) / 1000.0)};
      reply.output = take_output();
      return reply;
    }
    return lost_worker("the worker closed its reply channel");
  }
  WorkerReply reply;
  reply.body = nlohmann::json::parse(*line, nullptr, /*allow_exceptions=*/false);
  // Only the worker writes whole JSON objects that answer this very request; anything else on
  // the channel was written by candidate code, which ends the worker.
  if (reply.body.is_discarded() || !reply.body.is_object() ||
      reply.body.value("seq", uint64_t{0}) != sequence_) {
    return lost_worker(
        fmt::format("the reply channel carried something other than the "
                    "worker's reply (written by the candidate?): '{}'",
                    truncate_middle(*line, 160)));
  }
  reply.output = take_output();
  // More threads than at its start, or a count it could not take (-1): the candidate may have
  // left some running.
  if (const int threads = reply.body.value("threads", 0);
      threads_at_start_ > 0 && (threads < 0 || threads > threads_at_start_)) {
    replace_before_next_ = true;
  }
  if (reply.body.value("ok", false)) return reply;
  const std::string kind = reply.body.value("kind", "error");
  reply.detail = reply.body.value("error", std::string());
  if (kind == "oom") {
    reply.verdict = Verdict::oom;
  } else if (kind == "fault" || kind == "fatal") {
    // The worker exits after answering: a device fault leaves its context unusable, and a
    // fatal integrity failure leaves work running on the device.
    reply.verdict = kind == "fault" ? Verdict::crash : Verdict::invalid;
    end_worker(std::chrono::seconds(5));
  } else if (kind == "status") {
    reply.verdict = Verdict::wrong;
  } else if (kind == "invalid") {
    reply.verdict = Verdict::invalid;
  } else if (kind == "load") {
    reply.verdict = Verdict::compile_error;
  } else if (ran_candidate_) {
    // Candidate code shares the worker's process; an error there may be its doing.
    reply.verdict = Verdict::crash;
    reply.detail = "the worker failed: " + reply.detail;
    restart();
  } else {
    throw Error(fmt::format("worker error: {}", reply.detail));
  }
  return reply;
}

}  // namespace kforge
