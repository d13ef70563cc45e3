// rmsnorm: y[m, n] = x[m, n] / sqrt(mean_n(x[m, :]^2) + eps) * weight[n]
#include <cmath>

#include "core/parallel.h"
#include "ops/registry.h"

namespace kforge {
namespace {

class RmsNorm final : public OpSpec {
 public:
  std::string_view name() const override { return "rmsnorm"; }
  std::string_view formula() const override {
    return "y = x / sqrt(mean(x^2, last dim) + eps) * weight";
  }
  std::vector<std::string> size_names() const override { return {"M", "N"}; }
  std::vector<TensorSpec> tensors() const override {
    return {{"x", {"M", "N"}}, {"weight", {"N"}, false, true}, {"y", {"M", "N"}, true}};
  }
  std::vector<ScalarSpec> scalars() const override { return {{"eps", 1e-6}}; }

  std::vector<SizeCase> test_sizes() const override {
    return {{"small", {{"M", 1024}, {"N", 768}}},
            {"medium", {{"M", 4096}, {"N", 1024}}},
            {"large", {{"M", 4096}, {"N", 4096}}},
            {"llama", {{"M", 2048}, {"N", 4096}}},
            {"xlarge", {{"M", 8192}, {"N", 8192}}}};
  }
  std::vector<SizeCase> edge_sizes() const override {
    return {{"edge_1023", {{"M", 1023}, {"N", 768}}},
            {"edge_4097", {{"M", 4097}, {"N", 1024}}},
            {"one_row", {{"M", 1}, {"N", 4096}}},
            {"one_col", {{"M", 257}, {"N", 1}}},
            {"odd_width", {{"M", 33}, {"N", 1023}}},
            {"prime_width", {{"M", 7}, {"N", 4099}}},
            {"tiny", {{"M", 3}, {"N", 5}}}};
  }
  std::vector<SizeCase> bench_sizes() const override { return test_sizes(); }
  Sizes default_size() const override { return {{"M", 8192}, {"N", 8192}}; }
  std::vector<DType> dtypes() const override { return {DType::f16, DType::bf16, DType::f32}; }
  Tolerance tolerance(DType dtype) const override {
    return tolerance_by_dtype(dtype, {1e-2, 1e-2}, {2e-2, 2e-2}, {1e-5, 1e-5});
  }

  // The sum of squares of a row must fit in fp32 (the accumulation type every kernel is
  // expected to use), so |x| is capped at sqrt(FLT_MAX / N) / 2 for bf16 and fp32; fp16 values
  // are far below that.
  double max_input_magnitude(const Sizes& sizes, DType dtype) const override {
    const double n = static_cast<double>(sizes.at("N"));
    return std::min(0.9 * dtype_max(dtype), 0.5 * std::sqrt(3.4028234663852886e38 / n));
  }

  void reference(const Sizes& sizes, std::span<const std::vector<double>> in,
                 std::span<const double> scalars,
                 std::span<std::vector<double>> out) const override {
    const int64_t m = sizes.at("M"), n = sizes.at("N");
    const double eps = scalars[0];
    const auto& x = in[0];
    const auto& w = in[1];
    auto& y = out[0];
    parallel_for(
        m,
        [&](int64_t row) {
          const double* xr = x.data() + row * n;
          double sum_squares = 0;
          for (int64_t j = 0; j < n; ++j)
            sum_squares += xr[j] * xr[j];
          const double inv_rms = 1.0 / std::sqrt(sum_squares / static_cast<double>(n) + eps);
          for (int64_t j = 0; j < n; ++j)
            y[row * n + j] = xr[j] * inv_rms * w[j];
        },
        16);
  }

  Cost cost(const Sizes& sizes, DType dtype) const override {
    const double m = static_cast<double>(sizes.at("M")), n = static_cast<double>(sizes.at("N"));
    const double e = static_cast<double>(dtype_size(dtype));
    return {(2 * m * n + n) * e, 4 * m * n};
  }
};

}  // namespace

std::unique_ptr<OpSpec> make_rmsnorm_spec() {
  return std::make_unique<RmsNorm>();
}

}  // namespace kforge
