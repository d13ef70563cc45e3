// Device code kforge itself runs: plain, trusted fp32 kernels for GPU references of problems
// too large for the host reference, and the elementwise step of the cuBLAS MLP baseline.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kforge/kernel.h"

namespace kforge {

// In place over `rows` score rows of length s (row r is query r % s): p = softmax(scale * x),
// keys j > i masked out when causal. One block per row, fp32.
void launch_masked_softmax(float* scores, int64_t rows, int64_t s, float scale, bool causal,
                           cudaStream_t stream);

// x = x * x over n fp32 values: squared terms, for the root-sum-square magnitudes that scale
// dot-product tolerances.
void launch_square(float* x, int64_t n, cudaStream_t stream);

// h = silu(gate) * up, elementwise over n values of `dtype` (f16, bf16 or f32). The C ABI
// dtype keeps this header free of C++20, for nvcc's C++17.
void launch_silu_mul(const void* gate, const void* up, void* h, int64_t n, kf_dtype dtype,
                     cudaStream_t stream);

}  // namespace kforge
