// kforge's side of a worker: starts it, sends requests, and turns every way a request can fail
// into a verdict. When a worker dies or is killed, the next request starts a fresh one.
// Not thread-safe: one thread talks to a worker at a time.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/process.h"
#include "device/backend.h"
#include "run/verdict.h"

namespace kforge {

struct WorkerOptions {
  std::string backend = "cpu";  // "cuda" or "cpu"
  int device = 0;
  std::filesystem::path executable;  // the kforge binary; default: /proc/self/exe
  std::filesystem::path log_dir;     // worker logs; default: a temporary directory, removed
                                     // when the client is destroyed
  std::chrono::milliseconds start_timeout = std::chrono::seconds(60);
};

struct WorkerReply {
  Verdict verdict = Verdict::ok;  // ok: `body` holds the worker's answer
  nlohmann::json body;
  std::string detail;  // why, when not ok
  bool ok() const { return verdict == Verdict::ok; }
};

class WorkerClient {
 public:
  explicit WorkerClient(WorkerOptions options);
  ~WorkerClient();

  // The device the worker runs on (starts the worker).
  const DeviceInfo& device();
  // Sends a request and waits up to `timeout`.
  WorkerReply request(const nlohmann::json& request, std::chrono::milliseconds timeout);
  // Stops the current worker; the next request starts another (e.g. for a second-process
  // determinism check).
  void restart();
  int workers_started() const { return started_; }
  const WorkerOptions& options() const { return options_; }
  std::string log_tail(size_t max_bytes = 2000) const;

 private:
  void ensure_started();
  WorkerReply lost_worker(const std::string& what);

  WorkerOptions options_;
  std::unique_ptr<ChildProcess> child_;
  std::optional<DeviceInfo> device_;
  std::filesystem::path log_path_;
  int started_ = 0;
  bool owns_log_dir_ = false;  // a temporary directory we made, removed with the client
};

}  // namespace kforge
