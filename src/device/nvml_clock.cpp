#include "device/nvml_clock.h"

#include <dlfcn.h>

namespace kforge {
namespace {

// The few NVML entry points used here, declared by hand: the toolkit on build machines does not
// ship nvml.h. Return value 0 is NVML_SUCCESS; clock type 1 is NVML_CLOCK_SM.
using InitFn = int (*)();
using HandleByUuidFn = int (*)(const char*, void**);
using ClockFn = int (*)(void*, int, unsigned*);
using ReasonsFn = int (*)(void*, unsigned long long*);
constexpr int kClockSm = 1;

// Throttle-reason bits that mean the clock was pulled down by heat or hardware, not by a
// power-capped but otherwise normal boost (nvmlClocksEventReason*).
constexpr unsigned long long kHwSlowdown = 0x8;
constexpr unsigned long long kSwThermal = 0x20;
constexpr unsigned long long kHwThermal = 0x40;
constexpr unsigned long long kHwPowerBrake = 0x80;

template <typename Fn>
Fn symbol(void* lib, const char* name) {
  return reinterpret_cast<Fn>(dlsym(lib, name));
}

}  // namespace

NvmlClock::NvmlClock(const std::string& gpu_uuid) {
  library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library_) return;
  auto init = symbol<InitFn>(library_, "nvmlInit_v2");
  auto by_uuid = symbol<HandleByUuidFn>(library_, "nvmlDeviceGetHandleByUUID");
  auto max_clock = symbol<ClockFn>(library_, "nvmlDeviceGetMaxClockInfo");
  get_clock_ = symbol<ClockFn>(library_, "nvmlDeviceGetClockInfo");
  get_reasons_ = symbol<ReasonsFn>(library_, "nvmlDeviceGetCurrentClocksEventReasons");
  if (!get_reasons_) {
    get_reasons_ = symbol<ReasonsFn>(library_, "nvmlDeviceGetCurrentClocksThrottleReasons");
  }
  void* device = nullptr;
  if (!init || !by_uuid || !max_clock || !get_clock_ || init() != 0 ||
      by_uuid(gpu_uuid.c_str(), &device) != 0) {
    return;
  }
  unsigned mhz = 0;
  if (max_clock(device, kClockSm, &mhz) == 0) max_sm_clock_mhz_ = static_cast<int>(mhz);
  device_ = device;
}

NvmlClock::~NvmlClock() {
  if (library_) {
    if (auto shutdown = symbol<InitFn>(library_, "nvmlShutdown"); shutdown && device_) shutdown();
    dlclose(library_);
  }
}

ClockReading NvmlClock::read() const {
  ClockReading r;
  if (!device_) return r;
  unsigned mhz = 0;
  if (get_clock_(device_, kClockSm, &mhz) != 0) return r;
  r.available = true;
  r.sm_clock_mhz = static_cast<int>(mhz);
  if (get_reasons_) get_reasons_(device_, &r.throttle_reasons);
  const bool slowdown =
      (r.throttle_reasons & (kHwSlowdown | kSwThermal | kHwThermal | kHwPowerBrake)) != 0;
  const bool low_clock = max_sm_clock_mhz_ > 0 && r.sm_clock_mhz * 4 < max_sm_clock_mhz_ * 3;
  r.throttled = slowdown || low_clock;
  return r;
}

}  // namespace kforge
