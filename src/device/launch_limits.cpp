#include "device/launch_limits.h"

#include <fmt/format.h>

namespace kforge {
namespace {

// Clusters of more than 8 blocks are not portable (16 needs an opt-in attribute).
constexpr long long kPortableClusterLimit = 8;

}  // namespace

std::string threads_violation(long long threads, const DeviceInfo& device) {
  if (threads < 1) return "threads per block < 1";
  if (threads > device.max_threads_per_block) {
    return fmt::format("threads per block > the device's {}", device.max_threads_per_block);
  }
  return "";
}

std::string dynamic_shared_violation(long long bytes, const DeviceInfo& device) {
  if (bytes <= device.max_shared_per_block) return "";
  return fmt::format("dynamic shared memory > the device's {} bytes per block",
                     device.max_shared_per_block);
}

std::string cluster_violation(long long blocks, const DeviceInfo& device) {
  if (blocks < 1) return "cluster size < 1";
  if (blocks > 1 && device.backend == "cuda" && device.cc_major < 9) {
    return "thread-block clusters need compute capability 9.0";
  }
  if (blocks > kPortableClusterLimit) {
    return fmt::format("cluster size > {} (the portable limit)", kPortableClusterLimit);
  }
  return "";
}

Bindings problem_bindings(const DeviceInfo& device, DType dtype, const Sizes* sizes) {
  Bindings b = device.limits();
  b["elem_bytes"] = static_cast<long long>(dtype_size(dtype));
  if (sizes) {
    for (const auto& [name, value] : *sizes)
      b[name] = value;
  }
  return b;
}

const Requirement* first_broken_requirement(const KernelFile& file, const Bindings& bindings,
                                            bool with_pruning) {
  for (const Requirement& req : file.requirements) {
    if ((req.pruning_only && !with_pruning) || !req.expression.bound_by(bindings)) continue;
    if (req.expression.evaluate(bindings) == 0) return &req;
  }
  return nullptr;
}

std::string first_violation(const KernelFile& file, const Bindings& bindings,
                            const DeviceInfo& device, bool with_pruning) {
  if (const Requirement* req = first_broken_requirement(file, bindings, with_pruning)) {
    return fmt::format("{} '{}' (line {}) does not hold", req->pruning_only ? "prune" : "require",
                       req->expression.text(), req->line);
  }
  const auto check = [&](const std::optional<Expression>& e, auto violation) -> std::string {
    if (!e || !e->bound_by(bindings)) return "";
    return violation(e->evaluate(bindings), device);
  };
  for (const std::string& why : {check(file.block_threads, threads_violation),
                                 check(file.shared_bytes, dynamic_shared_violation),
                                 check(file.cluster_blocks, cluster_violation)}) {
    if (!why.empty()) return why;
  }
  return "";
}

}  // namespace kforge
