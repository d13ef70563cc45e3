// What libkforge_inject.so keeps of CUPTI's activity records until the process exits: compact
// rows copied out of each completed buffer (the buffer goes straight back to the allocator),
// written once at the end as the raw JSON file that src/profile/cupti_import.h documents.
//
// Only the buffer-completion callback (on CUPTI's worker thread) adds rows; pairing, linking and
// everything else happens later in `kforge profile`, outside the profiled program.
#pragma once

#include <sys/types.h>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <cupti.h>

namespace kforge::inject {

// A mutex that knows which thread holds it, so a signal handler can tell whether the thread it
// interrupted is in the middle of changing what the mutex guards (and must not wait for it).
class OwnedMutex {
 public:
  void lock();
  void unlock();
  bool held_by_this_thread() const;

 private:
  std::mutex mutex_;
  std::atomic<pid_t> owner_{0};
};

struct DeviceRow {
  uint32_t id = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  int sm_count = 0;
};

class ActivityStore {
 public:
  // Copies what kforge needs out of every record in a completed CUPTI buffer.
  void add_buffer(const uint8_t* buffer, size_t valid_size);
  void add_dropped(size_t count);
  void add_device(const DeviceRow& device);
  void add_error(const std::string& message);
  // Rows added since the last to_json().
  bool has_new_rows() const { return new_rows_.load(); }
  // The name of a runtime (else driver) API call by its callback id; "" when unknown.
  using ApiNamer = std::string (*)(bool runtime, uint32_t cbid);
  // The raw file's text. `written_at` says which exit path wrote it ("exit", "signal 15", ...).
  // Launch calls whose correlation id matches no kernel or transfer are left out; every call
  // CUPTI recorded is counted by its API (named by `namer` when given).
  std::string to_json(pid_t pid, const std::string& written_at, ApiNamer namer = nullptr);
  bool held_by_this_thread() const { return mutex_.held_by_this_thread(); }

 private:
  struct KernelRow {
    uint32_t name = 0;  // index into kernel_names_
    int32_t grid[3] = {0, 0, 0};
    int32_t block[3] = {0, 0, 0};
    uint32_t cluster[3] = {0, 0, 0};
    uint32_t registers = 0;
    int32_t static_smem = 0;
    int32_t dynamic_smem = 0;
    uint64_t start = 0;
    uint64_t end = 0;
    uint32_t device = 0;
    uint32_t stream = 0;
    uint32_t correlation = 0;
  };
  struct TransferRow {
    const char* kind = "";  // a string literal
    uint64_t bytes = 0;
    uint64_t start = 0;
    uint64_t end = 0;
    uint32_t device = 0;
    uint32_t stream = 0;
    uint32_t correlation = 0;
  };
  struct ApiRow {
    bool runtime = true;  // else driver
    uint32_t cbid = 0;
    uint32_t correlation = 0;
    uint32_t thread = 0;
    uint64_t start = 0;
    uint64_t end = 0;
  };
  struct MarkerRow {
    uint32_t id = 0;
    const char* kind = "";  // "start", "end" or "instant"
    uint64_t time = 0;
    uint32_t thread = 0;
    std::string name;
    std::string domain;
  };

  void add_record(const CUpti_Activity* record);
  uint32_t kernel_name_index(const char* name);

  OwnedMutex mutex_;
  std::atomic<bool> new_rows_{false};
  std::vector<std::string> kernel_names_;
  std::unordered_map<std::string, uint32_t> kernel_name_ids_;
  std::vector<KernelRow> kernels_;
  std::vector<TransferRow> transfers_;
  std::vector<ApiRow> api_calls_;
  std::unordered_map<uint64_t, uint64_t> api_counts_;  // (driver bit << 32 | cbid) -> calls
  std::vector<MarkerRow> markers_;
  std::vector<DeviceRow> devices_;
  std::mutex errors_mutex_;  // errors can be noted while mutex_ is held
  std::vector<std::string> errors_;
  uint64_t dropped_ = 0;
  uint64_t unknown_records_ = 0;
};

}  // namespace kforge::inject
