// kforge's side of a worker: starts it, sends requests, and turns every way a request can fail
// into a verdict. When a worker dies or is killed, the next request starts a fresh one.
// Nothing a candidate does in the worker can end or stall kforge: replies that are not the
// worker's own (a candidate writing to the channel) end the worker with a CRASH verdict, and
// what the candidate prints is captured per request. Not thread-safe: one thread talks to a
// worker at a time.
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
  // Runs the worker under this command (e.g. compute-sanitizer and its flags).
  std::vector<std::string> launcher;
  // >= 0: the worker runs on this CPU core only, so that CPU slots timed side by side do not
  // share a core (see pool/device_pool.h).
  int cpu_core = -1;
};

struct WorkerReply {
  Verdict verdict = Verdict::ok;  // ok: `body` holds the worker's answer
  nlohmann::json body;
  std::string detail;  // why, when not ok
  std::string output;  // what the worker printed while serving the request (truncated)
  bool ok() const { return verdict == Verdict::ok; }
};

// At most `max_bytes` of `text`: its start and end with a note of what was left out.
std::string truncate_middle(const std::string& text, size_t max_bytes);

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
  // Stops the worker and waits for it to exit by itself (its input closed): what it printed
  // since the last request, and how it ended. A sanitizer launcher prints its summary then.
  struct Finish {
    std::string output;
    ExitStatus status;
  };
  Finish finish();
  int workers_started() const { return started_; }
  const WorkerOptions& options() const { return options_; }
  std::string log_tail(size_t max_bytes = 2000) const;

 private:
  void ensure_started();
  // Waits up to `grace` for the worker to exit by itself, then ends its group, sweeps what it
  // left and forgets it.
  ExitStatus end_worker(std::chrono::milliseconds grace);
  WorkerReply lost_worker(const std::string& what);
  std::string take_output();

  WorkerOptions options_;
  std::unique_ptr<ChildProcess> child_;
  std::optional<DeviceInfo> device_;
  std::filesystem::path log_path_;
  size_t log_read_ = 0;               // bytes of the log already handed out as request output
  uint64_t sequence_ = 0;             // of the last request; a reply must carry it
  bool ran_candidate_ = false;        // the current worker has loaded candidate code
  int threads_at_start_ = -1;         // the worker's threads after it started
  bool replace_before_next_ = false;  // a candidate left threads of its own in the worker
  int started_ = 0;
  bool owns_log_dir_ = false;  // a temporary directory we made, removed with the client
};

}  // namespace kforge
