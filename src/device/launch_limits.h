// The launch limits a kernel file's declared `threads:`, `shared_bytes:` and `cluster:` values
// are held against before anything is compiled: by the tuner's space solver for every point,
// and by the checker for the one variant it builds.
#pragma once

#include <string>

#include "device/backend.h"

namespace kforge {

// Why a declared value breaks the device's limits, or "" when it does not.
std::string threads_violation(long long threads, const DeviceInfo& device);
std::string dynamic_shared_violation(long long bytes, const DeviceInfo& device);
std::string cluster_violation(long long blocks, const DeviceInfo& device);

}  // namespace kforge
