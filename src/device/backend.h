// The device side of kforge, behind one interface: CUDA GPUs and the host CPU. Only worker
// processes create backends; kforge itself never runs candidate code.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "compile/expression.h"
#include "compile/kernel_file.h"
#include "core/dtype.h"
#include "core/fresh_values.h"

namespace kforge {

struct DeviceInfo {
  std::string backend;  // "cuda" or "cpu"
  int index = 0;
  std::string name;
  std::string uuid;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;          // multiprocessors, or CPU cores
  int64_t total_memory = 0;  // bytes
  int64_t l2_bytes = 0;      // L2 on a GPU, last-level cache on a CPU
  int max_threads_per_block = 0;
  int64_t max_shared_per_block = 0;  // with opt-in
  int64_t max_shared_per_sm = 0;
  int regs_per_sm = 0;
  int regs_per_block = 0;
  int max_threads_per_sm = 0;
  int max_blocks_per_sm = 0;
  int64_t reserved_shared_per_block = 0;  // taken by the system from every block's share
  int warp_size = 0;
  int max_sm_clock_mhz = 0;
  std::string driver_version;
  std::string runtime_version;

  // "sm_90a" for a Hopper GPU; "host" for the CPU.
  std::string default_arch() const;
  // Device limits as expression variables (see docs/kernel-format.md).
  Bindings limits() const;
};

void to_json(nlohmann::json& j, const DeviceInfo& d);
void from_json(const nlohmann::json& j, DeviceInfo& d);

// The candidate's device code did something illegal; the device context may be unusable.
class KernelFault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A device allocation failed.
class OutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A candidate broke a rule of the measurement (docs/integrity.md). `fatal`: work it started may
// still be running, so the worker must not serve another request.
class IntegrityViolation : public std::runtime_error {
 public:
  explicit IntegrityViolation(const std::string& what, bool fatal = false)
      : std::runtime_error(what), fatal_(fatal) {}
  bool fatal() const { return fatal_; }

 private:
  bool fatal_;
};

// A tensor in device memory.
struct DeviceSpan {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t count = 0;  // elements
  size_t bytes() const { return static_cast<size_t>(count) * dtype_size(dtype); }
};

// What some buffers hold (the outputs of a call, or its inputs): a digest of every element
// (equal digests, equal contents) and how many elements hold the poison pattern (for outputs:
// never written).
struct Digest {
  uint64_t hash = 0;
  int64_t poisoned = 0;
  bool operator==(const Digest&) const = default;
};

// A candidate's call, made repeatable for timing. On the CUDA backend the call was captured
// into a graph, so a launch runs exactly the work the call put on the given stream and no
// candidate host code; on the CPU backend it is the call itself.
class RepeatableCall {
 public:
  virtual ~RepeatableCall() = default;
  virtual void launch() = 0;
};

struct ClockReading {
  bool available = false;
  int sm_clock_mhz = 0;
  unsigned long long throttle_reasons = 0;
  bool throttled = false;  // thermal or hardware slowdown, or SM clock below 75% of its max
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual const DeviceInfo& info() const = 0;
  virtual void* allocate(size_t bytes) = 0;  // throws OutOfMemory
  virtual void release(void* ptr) noexcept = 0;
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;  // async on stream
  virtual void* stream() = 0;  // passed to kernels in kf_args
  // Waits for the stream; throws KernelFault if device code failed.
  virtual void synchronize() = 0;
  // Throws KernelFault / OutOfMemory if the last launch failed to start.
  virtual void check_launch() = 0;
  // Times one call of `launch` in milliseconds. With `cold_cache`, none of `buffers` (the
  // call's inputs and outputs) is in any cache when it starts, so every sample reads its inputs
  // from memory; a backend may evict more than those (CUDA flushes the whole L2).
  virtual double time_once(const std::function<void()>& launch, bool cold_cache,
                           std::span<const DeviceSpan> buffers) = 0;
  virtual ClockReading read_clock() = 0;
  // Measured ceilings: a large copy (GB/s, bytes read + written) and, where there is a matrix
  // library, a large bf16 matrix product (TFLOP/s). Returns a JSON object.
  virtual nlohmann::json measure_ceilings() = 0;

  // The integrity rules of a measurement (docs/integrity.md). `call` has already run once on
  // these buffers (lazy initialization is done). CUDA: `outputs` are poisoned, the call is
  // captured into a graph, and it must have written no output element and left no work
  // running while it was captured: work outside the given stream throws IntegrityViolation.
  virtual std::unique_ptr<RepeatableCall> make_repeatable(const std::function<void()>& call,
                                                          std::span<const DeviceSpan> outputs) = 0;
  // Redraws elements [begin, end) of `tensor` from `seed` (asynchronously, in stream order).
  virtual void fill_fresh(const DeviceSpan& tensor, int64_t begin, int64_t end,
                          const FreshInput& rule, uint64_t seed) = 0;
  // Sets every bit of `tensor` (NaN, or -1), asynchronously.
  virtual void poison(const DeviceSpan& tensor) = 0;
  // Digest of the buffers, after everything queued so far.
  virtual Digest digest(std::span<const DeviceSpan> buffers) = 0;
  // Throws IntegrityViolation (fatal) when a candidate left work running: device work outside
  // the stream still busy after `limit` (CUDA), or threads of its own (CPU).
  virtual void check_nothing_left_running(std::chrono::milliseconds limit) = 0;
};

std::unique_ptr<DeviceBackend> make_cpu_backend();
std::unique_ptr<DeviceBackend> make_cuda_backend(int device);
// Devices the CUDA runtime sees; empty when there is no GPU or no driver.
std::vector<DeviceInfo> list_cuda_devices();
DeviceInfo cpu_device_info();

}  // namespace kforge
