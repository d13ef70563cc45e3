// What a compiled variant costs an SM, from its resource report and declared launch shape, and
// whether it is worth timing: a variant that cannot launch (registers x threads over the
// register file, shared memory over the per-block limit), that spills to local memory, or whose
// theoretical occupancy is below the file's declared minimum is rejected before it reaches the
// GPU, with the reason.
#pragma once

#include <optional>
#include <string>

#include "compile/compiler.h"
#include "device/backend.h"
#include "tune/space.h"

namespace kforge {

struct Occupancy {
  int blocks_per_sm = 0;
  int warps_per_sm = 0;
  double fraction = 0;  // resident warps over the SM's maximum
  std::string limiter;  // "threads", "registers", "shared memory" or "blocks"
};

// Theoretical occupancy of a kernel using `registers` per thread and `shared_bytes` per block
// (static + dynamic), launched with `threads` per block. Registers are allocated per warp in
// units of 256, shared memory per block in units of 128 bytes plus the device's reservation.
Occupancy theoretical_occupancy(const DeviceInfo& device, long long threads, int registers,
                                long long shared_bytes);

// The reason a compiled variant is not worth timing, or nullopt. `occupancy` receives the
// theoretical occupancy when the file declares its threads per block.
std::optional<std::string> post_compile_rejection(const ResourceReport& resources,
                                                  const LaunchShape& launch,
                                                  const DeviceInfo& device,
                                                  int min_occupancy_percent,
                                                  std::optional<Occupancy>* occupancy);

}  // namespace kforge
