// Device code of the measurement's integrity rules (docs/integrity.md): fresh inputs drawn on
// the device before every timed sample, the demotion of their L2 lines before the flush, and a
// digest of the outputs after it. kforge's own, trusted code; the C ABI dtype keeps this header
// within nvcc's C++17.
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

// Lowers every line of [data, data + bytes) that is in L2 to normal eviction priority. A kernel
// may load with an evict_last policy, and such lines outlast any amount of normal writes: a
// flush of twice the L2 leaves them where they are. Demoted first, they go like any other.
void launch_l2_demote(const void* data, size_t bytes, cudaStream_t stream);

// Adds each of the `count` elements' digest terms into result[0] and counts the poisoned ones
// into result[1] (both zeroed first). `element_bytes` is 2, 4 or 8.
void launch_digest(const void* data, int64_t count, int element_bytes, unsigned long long* result,
                   cudaStream_t stream);

}  // namespace kforge
