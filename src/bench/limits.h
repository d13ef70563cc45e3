// The fastest a problem can physically run on a device, from the ceilings measured there: its
// compulsory bytes at the copy bandwidth, its FLOPs at the matrix rate. A time below that is
// not a fast kernel but a broken measurement, and is refused with the arithmetic shown.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "device/ceilings.h"
#include "ops/op_spec.h"

namespace kforge {

// Margins over the measured ceilings, so that no honest kernel is ever refused:
//  - a stream that mostly reads can beat a copy's rate (copies count bytes read + written; on an
//    H200 cross-entropy reached 99% of the copy rate), and the ceiling itself is a median;
inline constexpr double kCopyMargin = 0.25;
//  - when the whole problem fits in L2, its writes may still sit in L2 when the timer stops;
inline constexpr double kL2ResidentCopyMargin = 1.5;
//  - a kernel may beat the library the matrix ceiling was measured with (the bf16 datasheet
//    peak of an H100/H200 is about 1.27x what cuBLAS reaches there).
inline constexpr double kMatmulMargin = 0.3;

// Why `seconds` is impossible for a problem of `cost` on a device with `ceilings` and
// `l2_bytes` of cache, with the arithmetic; nullopt when it is possible.
std::optional<std::string> physical_limit_violation(const Cost& cost, double seconds,
                                                    const Ceilings& ceilings, int64_t l2_bytes);

}  // namespace kforge
