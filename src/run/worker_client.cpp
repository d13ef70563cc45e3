#include "run/worker_client.h"

#include <unistd.h>
#include <atomic>
#include <csignal>
#include <fstream>
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
  }
  return "?";
}

std::optional<Verdict> parse_verdict(std::string_view name) {
  for (const Verdict v : {Verdict::ok, Verdict::wrong, Verdict::crash, Verdict::timeout,
                          Verdict::oom, Verdict::compile_error, Verdict::rejected}) {
    if (verdict_name(v) == name) return v;
  }
  return std::nullopt;
}

WorkerClient::WorkerClient(WorkerOptions options) : options_(std::move(options)) {
  // A worker that dies while we write to it must not take kforge down with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
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
  child_ = std::make_unique<ChildProcess>(
      std::vector<std::string>{options_.executable.string(), "__worker", "--backend",
                               options_.backend, "--device", std::to_string(options_.device)},
      log_path_.string());
  child_->send_line(R"({"op":"hello"})");
  bool timed_out = false;
  const auto line = child_->receive_line(options_.start_timeout, &timed_out);
  if (!line) {
    const ExitStatus status = child_->kill_and_wait();
    child_.reset();
    throw Error(fmt::format("the {} worker did not start ({}): {}", options_.backend,
                            timed_out ? "no answer" : status.describe(), log_tail()));
  }
  const auto reply = nlohmann::json::parse(*line);
  if (!reply.value("ok", false)) {
    child_.reset();
    throw Error(reply.value("error", std::string("the worker did not start")));
  }
  device_ = reply.at("device").get<DeviceInfo>();
}

const DeviceInfo& WorkerClient::device() {
  ensure_started();
  return *device_;
}

void WorkerClient::restart() {
  if (child_) child_->kill_and_wait();
  child_.reset();
}

std::string WorkerClient::log_tail(size_t max_bytes) const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  if (text.size() > max_bytes) text = "..." + text.substr(text.size() - max_bytes);
  return text;
}

WorkerReply WorkerClient::lost_worker(const std::string& what) {
  WorkerReply reply;
  reply.verdict = Verdict::crash;
  const ExitStatus status = child_->kill_and_wait();
  reply.detail = fmt::format("{}: worker {}", what, status.describe());
  const std::string tail = log_tail(600);
  if (!tail.empty()) reply.detail += "; its log ends: " + tail;
  child_.reset();
  return reply;
}

WorkerReply WorkerClient::request(const nlohmann::json& request,
                                  std::chrono::milliseconds timeout) {
  ensure_started();
  if (!child_->send_line(request.dump())) return lost_worker("request not delivered");
  bool timed_out = false;
  const auto line = child_->receive_line(timeout, &timed_out);
  if (!line) {
    if (timed_out) {
      // A kernel that never ends cannot be interrupted from inside; killing the process frees
      // the device.
      child_->kill_and_wait();
      child_.reset();
      return {Verdict::timeout,
              {},
              fmt::format("no answer within {:.1f} s; worker killed",
                          static_cast<double>(timeout.count()) / 1000.0)};
    }
    return lost_worker("worker died");
  }
  WorkerReply reply;
  reply.body = nlohmann::json::parse(*line);
  if (reply.body.value("ok", false)) return reply;
  const std::string kind = reply.body.value("kind", "error");
  reply.detail = reply.body.value("error", std::string());
  if (kind == "oom") {
    reply.verdict = Verdict::oom;
  } else if (kind == "fault") {
    reply.verdict = Verdict::crash;
    child_->try_wait(std::chrono::seconds(5));
    child_->kill_and_wait();
    child_.reset();
  } else if (kind == "status") {
    reply.verdict = Verdict::wrong;
  } else if (kind == "load") {
    reply.verdict = Verdict::compile_error;
  } else {
    throw Error(fmt::format("worker error: {}", reply.detail));
  }
  return reply;
}

}  // namespace kforge
