#include "tune/occupancy.h"

#include <algorithm>

#include <fmt/format.h>

namespace kforge {
namespace {

constexpr int kRegisterAllocationUnit = 256;  // registers, per warp (sm_70 and later)
constexpr long long kSharedAllocationUnit = 128;

long long round_up(long long value, long long unit) {
  return (value + unit - 1) / unit * unit;
}

long long warps_per_block(const DeviceInfo& device, long long threads) {
  const long long warp = std::max(1, device.warp_size);
  return (threads + warp - 1) / warp;
}

// Registers a block is allocated: per warp, rounded up to the allocation unit.
long long registers_per_block(const DeviceInfo& device, long long threads, int registers) {
  const long long per_warp = round_up(
      static_cast<long long>(registers) * std::max(1, device.warp_size), kRegisterAllocationUnit);
  return per_warp * warps_per_block(device, threads);
}

}  // namespace

Occupancy theoretical_occupancy(const DeviceInfo& device, long long threads, int registers,
                                long long shared_bytes) {
  Occupancy o;
  const long long warps = warps_per_block(device, threads);
  const long long max_warps = device.max_threads_per_sm / std::max(1, device.warp_size);
  if (warps <= 0 || max_warps <= 0) return o;

  long long blocks = device.max_blocks_per_sm;
  o.limiter = "blocks";
  const auto limit = [&](long long by, const char* what) {
    if (by < blocks) {
      blocks = by;
      o.limiter = what;
    }
  };
  limit(max_warps / warps, "threads");
  if (registers > 0) {
    limit(device.regs_per_sm / registers_per_block(device, threads, registers), "registers");
  }
  if (shared_bytes > 0) {
    const long long per_block =
        round_up(shared_bytes, kSharedAllocationUnit) + device.reserved_shared_per_block;
    limit(device.max_shared_per_sm / per_block, "shared memory");
  }
  o.blocks_per_sm = static_cast<int>(std::max(0LL, blocks));
  o.warps_per_sm = static_cast<int>(o.blocks_per_sm * warps);
  o.fraction = static_cast<double>(o.warps_per_sm) / static_cast<double>(max_warps);
  return o;
}

std::optional<std::string> post_compile_rejection(const ResourceReport& resources,
                                                  const LaunchShape& launch,
                                                  const DeviceInfo& device,
                                                  int min_occupancy_percent,
                                                  std::optional<Occupancy>* occupancy) {
  if (occupancy) occupancy->reset();
  if (resources.functions.empty()) return std::nullopt;  // the CPU backend reports none
  if (resources.spills()) return "spills registers to local memory";
  if (const std::string why = resources.serialized_wgmma(); !why.empty()) {
    return fmt::format("ptxas serializes its wgmma instructions ({})", why);
  }
  const long long shared = resources.max_static_shared_bytes() + launch.dynamic_shared_bytes;
  if (shared > device.max_shared_per_block) {
    return fmt::format("static + dynamic shared memory > the device's {} bytes per block",
                       device.max_shared_per_block);
  }
  if (launch.threads <= 0) return std::nullopt;  // no `threads:` declared: nothing more to judge
  const int registers = resources.max_registers();
  if (registers_per_block(device, launch.threads, registers) > device.regs_per_block) {
    return fmt::format("registers x threads > the register file ({} per block)",
                       device.regs_per_block);
  }
  const Occupancy o = theoretical_occupancy(device, launch.threads, registers, shared);
  if (occupancy) *occupancy = o;
  if (o.blocks_per_sm == 0) return fmt::format("no block fits on an SM ({})", o.limiter);
  if (min_occupancy_percent > 0 && 100.0 * o.fraction < min_occupancy_percent) {
    return fmt::format("theoretical occupancy < {}%", min_occupancy_percent);
  }
  return std::nullopt;
}

}  // namespace kforge
