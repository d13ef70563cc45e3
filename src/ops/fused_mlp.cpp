// fused_mlp (SwiGLU): y = (silu(x W_gate^T) * (x W_up^T)) W_down^T
//   x [batch, dim], w_gate [hidden, dim], w_up [hidden, dim], w_down [dim, hidden]
// Weights are drawn N(0, 1/fan_in), so every intermediate stays O(1) as in real models.
#include <cmath>

#include "core/parallel.h"
#include "ops/registry.h"

namespace kforge {
namespace {

Sizes bdh(int64_t b, int64_t d, int64_t h) {
  return {{"batch", b}, {"dim", d}, {"hidden", h}};
}

class FusedMlp final : public OpSpec {
 public:
  std::string_view name() const override { return "fused_mlp"; }
  std::string_view formula() const override {
    return "y = (silu(x W_gate^T) * (x W_up^T)) W_down^T";
  }
  std::vector<std::string> size_names() const override { return {"batch", "dim", "hidden"}; }
  std::vector<TensorSpec> tensors() const override {
    return {{"x", {"batch", "dim"}},
            {"w_gate", {"hidden", "dim"}, false, true, std::nullopt, "dim"},
            {"w_up", {"hidden", "dim"}, false, true, std::nullopt, "dim"},
            {"w_down", {"dim", "hidden"}, false, true, std::nullopt, "hidden"},
            {"y", {"batch", "dim"}, true}};
  }
  std::vector<SizeCase> test_sizes() const override {
    return {{"tiny", bdh(32, 128, 256)},        {"small", bdh(256, 512, 1024)},
            {"medium", bdh(1024, 1024, 2048)},  {"large", bdh(2048, 2048, 5504)},
            {"xlarge", bdh(4096, 4096, 11008)}, {"llm_7b", bdh(2048, 4096, 11008)},
            {"llm_13b", bdh(2048, 5120, 13824)}};
  }
  std::vector<SizeCase> edge_sizes() const override {
    return {{"edge_1023", bdh(1023, 1024, 2048)},
            {"edge_4097", bdh(4097, 512, 1024)},
            {"one_row", bdh(1, 256, 512)},
            {"odd", bdh(33, 65, 129)}};
  }
  std::vector<SizeCase> bench_sizes() const override { return test_sizes(); }
  Sizes default_size() const override { return bdh(2048, 4096, 11008); }
  std::vector<DType> dtypes() const override { return {DType::f16, DType::bf16, DType::f32}; }
  Tolerance tolerance(DType dtype) const override {
    return tolerance_by_dtype(dtype, {1e-2, 1e-2}, {2e-2, 2e-2}, {1e-4, 1e-4});
  }
  // silu(gate) * up grows like |x|^2: keep the output within the dtype (fp32 for bf16).
  double max_input_magnitude(const Sizes&, DType dtype) const override {
    return 0.25 * std::sqrt(dtype == DType::f16 ? 65504.0 : 3.4028234663852886e38);
  }
  // Each output is a dot product: its rounding error scales with the root-sum-square of its
  // terms, which reference() provides as the magnitude (see matmul).
  bool tolerance_relative_to_magnitude() const override { return true; }

  std::vector<InputKind> stability_kinds() const override {
    return {InputKind::mixed_scales, InputKind::all_zeros, InputKind::all_equal,
            InputKind::near_zero};
  }

  void reference(const Sizes& sizes, std::span<const std::vector<double>> in,
                 std::span<const double>, std::span<std::vector<double>> out) const override {
    const int64_t b = sizes.at("batch"), d = sizes.at("dim"), h = sizes.at("hidden");
    const auto &x = in[0], &wg = in[1], &wu = in[2], &wd = in[3];
    auto& y = out[0];
    parallel_for(b, [&](int64_t r) {
      const double* xr = x.data() + r * d;
      std::vector<double> act(static_cast<size_t>(h));
      for (int64_t j = 0; j < h; ++j) {
        double gate = 0, up = 0;
        for (int64_t t = 0; t < d; ++t) {
          gate += xr[t] * wg[j * d + t];
          up += xr[t] * wu[j * d + t];
        }
        act[j] = gate / (1.0 + std::exp(-gate)) * up;
      }
      for (int64_t c = 0; c < d; ++c) {
        double acc = 0, squares = 0;
        for (int64_t j = 0; j < h; ++j) {
          const double term = act[j] * wd[c * h + j];
          acc += term;
          squares += term * term;
        }
        y[r * d + c] = acc;
        if (out.size() > 1) out[1][r * d + c] = std::sqrt(squares);
      }
    });
  }

  Cost cost(const Sizes& sizes, DType dtype) const override {
    const double b = static_cast<double>(sizes.at("batch")),
                 d = static_cast<double>(sizes.at("dim")),
                 h = static_cast<double>(sizes.at("hidden"));
    return {(2 * b * d + 3 * h * d) * static_cast<double>(dtype_size(dtype)), 6 * b * d * h};
  }
};

}  // namespace

std::unique_ptr<OpSpec> make_fused_mlp_spec() {
  return std::make_unique<FusedMlp>();
}

}  // namespace kforge
