// Reads the SM clock and throttle reasons through NVML, loaded at run time: NVML ships with the
// driver, so machines without one (CI) simply report "not monitored".
#pragma once

#include <string>

#include "device/backend.h"

namespace kforge {

class NvmlClock {
 public:
  explicit NvmlClock(const std::string& gpu_uuid);  // "GPU-xxxxxxxx-..."
  ~NvmlClock();
  NvmlClock(const NvmlClock&) = delete;
  NvmlClock& operator=(const NvmlClock&) = delete;

  bool available() const { return device_ != nullptr; }
  int max_sm_clock_mhz() const { return max_sm_clock_mhz_; }
  ClockReading read() const;

 private:
  void* library_ = nullptr;
  void* device_ = nullptr;
  int max_sm_clock_mhz_ = 0;
  int (*get_clock_)(void*, int, unsigned*) = nullptr;
  int (*get_reasons_)(void*, unsigned long long*) = nullptr;
};

}  // namespace kforge
