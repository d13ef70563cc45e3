// layernorm: y[b, d] = (x[b, d] - mean_d x[b, :]) / sqrt(var_d x[b, :] + eps) * weight[d] + bias[d]
#include <cmath>

#include "core/parallel.h"
#include "ops/registry.h"

namespace kforge {
namespace {

class LayerNorm final : public OpSpec {
 public:
  std::string_view name() const override { return "layernorm"; }
  std::string_view formula() const override {
    return "y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias, over the last dim";
  }
  std::vector<std::string> size_names() const override { return {"batch", "dim"}; }
  std::vector<TensorSpec> tensors() const override {
    return {{"x", {"batch", "dim"}},
            {"weight", {"dim"}, false, true},
            {"bias", {"dim"}, false, true},
            {"y", {"batch", "dim"}, true}};
  }
  std::vector<ScalarSpec> scalars() const override { return {{"eps", 1e-5}}; }

  std::vector<SizeCase> test_sizes() const override {
    return {{"tiny", {{"batch", 32}, {"dim", 128}}},
            {"small", {{"batch", 256}, {"dim", 512}}},
            {"medium", {{"batch", 1024}, {"dim", 1024}}},
            {"large", {{"batch", 4096}, {"dim", 2048}}},
            {"xlarge", {{"batch", 8192}, {"dim", 4096}}},
            {"wide", {{"batch", 1024}, {"dim", 8192}}},
            {"llm_7b", {{"batch", 4096}, {"dim", 4096}}},
            {"llm_13b", {{"batch", 4096}, {"dim", 5120}}}};
  }
  std::vector<SizeCase> edge_sizes() const override {
    return {{"edge_1023", {{"batch", 1023}, {"dim", 1023}}},
            {"edge_4097", {{"batch", 4097}, {"dim", 4097}}},
            {"one_row", {{"batch", 1}, {"dim", 4096}}},
            {"one_col", {{"batch", 257}, {"dim", 1}}},
            {"prime_width", {{"batch", 7}, {"dim", 4099}}},
            {"tiny", {{"batch", 3}, {"dim", 5}}}};
  }
  std::vector<SizeCase> bench_sizes() const override { return test_sizes(); }
  Sizes default_size() const override { return {{"batch", 8192}, {"dim", 4096}}; }
  std::vector<DType> dtypes() const override { return {DType::f16, DType::bf16, DType::f32}; }
  Tolerance tolerance(DType dtype) const override {
    // bf16 keeps 8 significant bits: rounding alone moves a value by up to 2^-8 = 3.9e-3
    // of itself, so a tolerance below that would fail correctly rounded outputs.
    return tolerance_by_dtype(dtype, {1e-3, 1e-3}, {1e-2, 1e-2}, {1e-5, 1e-5});
  }
  // Near-constant rows (variance ~ 0) and huge magnitudes are the traps here.
  std::vector<InputKind> stability_kinds() const override {
    auto kinds = OpSpec::stability_kinds();
    kinds.push_back(InputKind::near_constant);
    return kinds;
  }
  // (x - mean)^2 summed over a row must fit in fp32.
  double max_input_magnitude(const Sizes& sizes, DType dtype) const override {
    const double n = static_cast<double>(sizes.at("dim"));
    return std::min(0.9 * dtype_max(dtype), 0.25 * std::sqrt(3.4028234663852886e38 / n));
  }

  void reference(const Sizes& sizes, std::span<const std::vector<double>> in,
                 std::span<const double> scalars,
                 std::span<std::vector<double>> out) const override {
    const int64_t rows = sizes.at("batch"), n = sizes.at("dim");
    const double eps = scalars[0];
    const auto &x = in[0], &w = in[1], &b = in[2];
    auto& y = out[0];
    parallel_for(
        rows,
        [&](int64_t r) {
          const double* xr = x.data() + r * n;
          double mean = 0;
          for (int64_t j = 0; j < n; ++j)
            mean += xr[j];
          mean /= static_cast<double>(n);
          double var = 0;
          for (int64_t j = 0; j < n; ++j)
            var += (xr[j] - mean) * (xr[j] - mean);
          var /= static_cast<double>(n);
          const double inv_std = 1.0 / std::sqrt(var + eps);
          for (int64_t j = 0; j < n; ++j)
            y[r * n + j] = (xr[j] - mean) * inv_std * w[j] + b[j];
        },
        16);
  }

  Cost cost(const Sizes& sizes, DType dtype) const override {
    const double m = static_cast<double>(sizes.at("batch")),
                 n = static_cast<double>(sizes.at("dim"));
    return {(2 * m * n + 2 * n) * static_cast<double>(dtype_size(dtype)), 8 * m * n};
  }
};

}  // namespace

std::unique_ptr<OpSpec> make_layernorm_spec() {
  return std::make_unique<LayerNorm>();
}

}  // namespace kforge
