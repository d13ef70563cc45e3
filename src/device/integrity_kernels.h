// Device code of the measurement's integrity rules (docs/integrity.md): fresh inputs drawn on
// the device before every timed sample, and a digest of the outputs after it. kforge's own,
// trusted code; the C ABI dtype keeps this header within nvcc's C++17.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "core/fresh_values.h"
#include "kforge/kernel.h"

namespace kforge {

// Elements [begin, end) of a tensor of `dtype` redrawn from `seed` as `rule` says (see
// core/fresh_values.h: the same values the CPU backend draws).
void launch_fill_fresh(void* data, kf_dtype dtype, int64_t begin, int64_t end,
                       const FreshInput& rule, uint64_t seed, cudaStream_t stream);

// Adds each of the `count` elements' digest terms into result[0] and counts the poisoned ones
// into result[1] (both zeroed first). `element_bytes` is 2, 4 or 8.
void launch_digest(const void* data, int64_t count, int element_bytes, unsigned long long* result,
                   cudaStream_t stream);

}  // namespace kforge
