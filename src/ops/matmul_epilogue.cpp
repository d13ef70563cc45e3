// The matmuls with an epilogue that models fuse into the GEMM's output:
//   matmul_bias:     C[m, n] = sum_k A[m, k] * B[k, n] + bias[n]   (nn.Linear with bias: Qwen2's
//                    q, k and v projections)
//   matmul_residual: C[m, n] = sum_k A[m, k] * B[k, n] + R[m, n]   (the residual added after a
//                    Llama or Qwen2 block's o_proj and down_proj)
// Sizes, dtypes, tolerances and the input cap are matmul's; the reference adds the term in
// float64. fp32 means fp32: no TF32.
#include <cmath>

#include "ops/matmul.h"
#include "ops/registry.h"

namespace kforge {
namespace {

class MatmulEpilogue : public OpSpec {
 public:
  std::vector<std::string> size_names() const override { return {"M", "N", "K"}; }
  std::vector<TensorSpec> tensors() const override {
    return {{"A", {"M", "K"}}, {"B", {"K", "N"}}, added_tensor(), {"C", {"M", "N"}, true}};
  }
  std::vector<SizeCase> test_sizes() const override {
    std::vector<SizeCase> sizes = matmul_test_sizes();
    for (SizeCase& model : model_sizes())
      sizes.push_back(std::move(model));
    return sizes;
  }
  std::vector<SizeCase> edge_sizes() const override { return matmul_edge_sizes(); }
  std::vector<SizeCase> bench_sizes() const override { return test_sizes(); }
  Sizes default_size() const override { return matmul_sizes(4096, 4096, 4096); }
  std::vector<DType> dtypes() const override { return {DType::f16, DType::bf16, DType::f32}; }
  Tolerance tolerance(DType dtype) const override {
    return tolerance_by_dtype(dtype, {1e-2, 1e-2}, {2e-2, 2e-2}, {1e-4, 1e-4});
  }
  // The products stay within a quarter of the output's range at matmul's cap; the added term,
  // one input value, adds little to that.
  double max_input_magnitude(const Sizes& sizes, DType dtype) const override {
    return matmul_max_input_magnitude(sizes, dtype);
  }

  // An element is a sum of K products and one added term; its magnitude is the root-sum-square
  // of all K + 1 terms, matmul's rule with the term counted as one more. With the term in it,
  // the magnitude bounds |A @ B| where the term cancels the product (|A @ B| <= |C| + |term|),
  // so an implementation that rounds A @ B to the dtype before adding (a matmul, then an add)
  // stays within the tolerance; a tolerance on the products' root-sum-square alone could be
  // sqrt(K) times smaller than that rounding.
  bool tolerance_relative_to_magnitude() const override { return true; }

  void reference(const Sizes& sizes, std::span<const std::vector<double>> in,
                 std::span<const double>, std::span<std::vector<double>> out) const override {
    const int64_t m = sizes.at("M"), n = sizes.at("N");
    const bool magnitude = out.size() > 1;
    matmul_products(sizes, in[0], in[1], out[0], magnitude ? &out[1] : nullptr);
    const std::vector<double>& added = in[2];
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const double term = added[static_cast<size_t>(added_index(i, j, n))];
        const size_t at = static_cast<size_t>(i * n + j);
        out[0][at] += term;
        if (magnitude) out[1][at] = std::sqrt(out[1][at] + term * term);
      }
    }
  }

  Cost cost(const Sizes& sizes, DType dtype) const override {
    const double m = static_cast<double>(sizes.at("M")), n = static_cast<double>(sizes.at("N")),
                 k = static_cast<double>(sizes.at("K"));
    const double elements = m * k + k * n + m * n + added_elements(m, n);
    return {elements * static_cast<double>(dtype_size(dtype)), 2 * m * n * k + m * n};
  }

 protected:
  virtual TensorSpec added_tensor() const = 0;
  // Where element (i, j) of C finds its added term in the added tensor, for N columns.
  virtual int64_t added_index(int64_t i, int64_t j, int64_t n) const = 0;
  virtual double added_elements(double m, double n) const = 0;
  // The shapes of the models' layers that use the op, at 4096 tokens.
  virtual std::vector<SizeCase> model_sizes() const = 0;
};

class MatmulBias final : public MatmulEpilogue {
 public:
  std::string_view name() const override { return "matmul_bias"; }
  std::string_view formula() const override { return "C = A @ B + bias"; }

 protected:
  // Drawn N(0, 1) like A and B: a kernel that drops the bias errs by O(1), well outside the
  // tolerance of products of size sqrt(K).
  TensorSpec added_tensor() const override { return {"bias", {"N"}, false, true}; }
  int64_t added_index(int64_t, int64_t j, int64_t) const override { return j; }
  double added_elements(double, double n) const override { return n; }
  std::vector<SizeCase> model_sizes() const override {
    // Qwen2-7B: hidden 3584; k and v have 4 heads of 128.
    return {{"qwen2_q", matmul_sizes(4096, 3584, 3584)},
            {"qwen2_kv", matmul_sizes(4096, 512, 3584)}};
  }
};

class MatmulResidual final : public MatmulEpilogue {
 public:
  std::string_view name() const override { return "matmul_residual"; }
  std::string_view formula() const override { return "C = A @ B + R"; }

 protected:
  TensorSpec added_tensor() const override { return {"R", {"M", "N"}}; }
  int64_t added_index(int64_t i, int64_t j, int64_t n) const override { return i * n + j; }
  double added_elements(double m, double n) const override { return m * n; }
  std::vector<SizeCase> model_sizes() const override {
    // Llama-2-7B's down_proj (its o_proj is xlarge); Qwen2-7B's o_proj and down_proj.
    return {{"llama_down", matmul_sizes(4096, 4096, 11008)},
            {"qwen2_o", matmul_sizes(4096, 3584, 3584)},
            {"qwen2_down", matmul_sizes(4096, 3584, 18944)}};
  }
};

}  // namespace

std::unique_ptr<OpSpec> make_matmul_bias_spec() {
  return std::make_unique<MatmulBias>();
}

std::unique_ptr<OpSpec> make_matmul_residual_spec() {
  return std::make_unique<MatmulResidual>();
}

}  // namespace kforge
