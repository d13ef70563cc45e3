// Ceilings measured on the device itself (never a datasheet table): copy bandwidth and, on a
// GPU, bf16 matrix throughput. Measured once per device and cached.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "run/worker_client.h"

namespace kforge {

struct Ceilings {
  double copy_gbps = 0;
  std::optional<double> matmul_tflops;
  std::string measured_at;  // date
  bool from_cache = false;
  nlohmann::json raw;
};

// Loads the cached ceilings of the worker's device, or measures them (refresh forces that).
Ceilings device_ceilings(WorkerClient& worker, const std::filesystem::path& cache_dir, bool refresh,
                         const std::function<void(const std::string&)>& progress);

}  // namespace kforge
