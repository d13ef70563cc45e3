// The device side of kforge, behind one interface: CUDA GPUs and the host CPU. Only worker
// processes create backends; kforge itself never runs candidate code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "compile/expression.h"
#include "compile/kernel_file.h"

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
  // Times one call of `launch` in milliseconds. With `cold_cache`, the cache is flushed first
  // (so every sample reads its inputs from memory).
  virtual double time_once(const std::function<void()>& launch, bool cold_cache) = 0;
  virtual ClockReading read_clock() = 0;
  // Measured ceilings: a large copy (GB/s, bytes read + written) and, where there is a matrix
  // library, a large bf16 matrix product (TFLOP/s). Returns a JSON object.
  virtual nlohmann::json measure_ceilings() = 0;
};

std::unique_ptr<DeviceBackend> make_cpu_backend();
std::unique_ptr<DeviceBackend> make_cuda_backend(int device);
// Devices the CUDA runtime sees; empty when there is no GPU or no driver.
std::vector<DeviceInfo> list_cuda_devices();
DeviceInfo cpu_device_info();

}  // namespace kforge
