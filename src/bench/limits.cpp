#include "bench/limits.h"

#include <fmt/format.h>

namespace kforge {

std::optional<std::string> physical_limit_violation(const Cost& cost, double seconds,
                                                    const Ceilings& ceilings, int64_t l2_bytes) {
  const double us = seconds * 1e6;
  if (ceilings.copy_gbps > 0 && cost.bytes > 0) {
    const bool l2_resident = l2_bytes > 0 && cost.bytes <= static_cast<double>(l2_bytes);
    const double margin = l2_resident ? kL2ResidentCopyMargin : kCopyMargin;
    const double floor_us = cost.bytes / (ceilings.copy_gbps * 1e3 * (1 + margin));
    if (us < floor_us) {
      return fmt::format(
          "{:.2f} us is faster than this device allows: the problem moves at least {:.0f} bytes, "
          "which takes at least {:.2f} us at the measured copy ceiling of {:.4g} GB/s plus a "
          "{:.0f}% margin{} ({:.0f}% of the ceiling claimed)",
          us, cost.bytes, floor_us, ceilings.copy_gbps, 100 * margin,
          l2_resident ? " (the problem fits in the device's cache)" : "",
          100 * cost.bytes / seconds / 1e9 / ceilings.copy_gbps);
    }
  }
  if (ceilings.matmul_tflops && *ceilings.matmul_tflops > 0 && cost.flops > 0) {
    const double floor_us = cost.flops / (*ceilings.matmul_tflops * 1e6 * (1 + kMatmulMargin));
    if (us < floor_us) {
      return fmt::format(
          "{:.2f} us is faster than this device allows: the problem does {:.4g} FLOPs, which take "
          "at least {:.2f} us at the measured matrix ceiling of {:.4g} TFLOP/s plus a {:.0f}% "
          "margin ({:.0f}% of the ceiling claimed)",
          us, cost.flops, floor_us, *ceilings.matmul_tflops, 100 * kMatmulMargin,
          100 * cost.flops / seconds / 1e12 / *ceilings.matmul_tflops);
    }
  }
  return std::nullopt;
}

}  // namespace kforge
