// What the matmul-shaped ops share (matmul, matmul_bias, matmul_residual): their size sets,
// their input cap and the float64 product that their references start from.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/op_spec.h"

namespace kforge {

Sizes matmul_sizes(int64_t m, int64_t n, int64_t k);
std::vector<SizeCase> matmul_test_sizes();
std::vector<SizeCase> matmul_edge_sizes();

// Products of two near-max values overflow in any dtype: the largest input magnitude for which
// a dot product of K of them stays within fp32 (and within fp16 for fp16 outputs).
double matmul_max_input_magnitude(const Sizes& sizes, DType dtype);

// c[M, N] = a[M, K] @ b[K, N] in float64, rows in parallel. With `squares`, also each element's
// sum of squared products (the square of matmul's magnitude).
void matmul_products(const Sizes& sizes, const std::vector<double>& a, const std::vector<double>& b,
                     std::vector<double>& c, std::vector<double>* squares);

}  // namespace kforge
