// The host's way of drawing fresh inputs (core/fresh_values.h): the CPU backend's before every
// timed sample, and the checker's when it changes one row of an input.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/fresh_values.h"

namespace kforge {

// Elements [begin, end) of a buffer of `dtype` redrawn from `seed` as `rule` says.
void fill_fresh_host(std::byte* data, DType dtype, int64_t begin, int64_t end,
                     const FreshInput& rule, uint64_t seed);

}  // namespace kforge
