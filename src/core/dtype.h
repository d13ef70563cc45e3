// Element types as kforge sees them on the host, with conversions through double.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "kforge/kernel.h"

namespace kforge {

enum class DType { f16, bf16, f32, f64, i32, i64 };

std::string_view dtype_name(DType dtype);
std::optional<DType> parse_dtype(std::string_view name);  // accepts f16/fp16/half, bf16, ...
size_t dtype_size(DType dtype);
kf_dtype to_abi(DType dtype);
bool is_floating(DType dtype);

// Largest finite value of a floating dtype.
double dtype_max(DType dtype);
// Smallest positive normal value of a floating dtype.
double dtype_min_normal(DType dtype);

// Element i of a buffer of `dtype`, widened to double.
double load_element(const std::byte* data, DType dtype, size_t i);
// Store v rounded to nearest even (through float for the 16-bit types).
void store_element(std::byte* data, DType dtype, size_t i, double v);

// Converts a whole buffer to double.
void widen_to_double(const std::byte* data, DType dtype, std::span<double> out);
// Fills a floating buffer with quiet NaN, so any element a kernel does not write is caught.
void fill_nan(std::byte* data, DType dtype, size_t count);

}  // namespace kforge
