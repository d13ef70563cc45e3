// Ceilings measured on the device itself (never a datasheet table): copy bandwidth and, on a
// GPU, bf16 matrix throughput. Measured once per device and cached.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

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

// Ceilings from a file `kforge ceilings --json FILE` wrote; throws UsageError naming the file.
Ceilings read_ceilings_file(const std::filesystem::path& path);

// The newest ceilings cached under cache_dir for a device of this name ("NVIDIA H100 80GB HBM3"),
// measured on any machine that shares the cache; nullopt when none is cached.
std::optional<Ceilings> cached_ceilings_by_name(const std::filesystem::path& cache_dir,
                                                std::string_view device_name);

}  // namespace kforge
