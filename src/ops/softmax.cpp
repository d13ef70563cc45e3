// softmax: y[r, c] = exp(x[r, c] - max_c x[r, :]) / sum_c exp(x[r, :] - max)
#include <cmath>

#include "core/parallel.h"
#include "ops/registry.h"

namespace kforge {
namespace {

class Softmax final : public OpSpec {
 public:
  std::string_view name() const override { return "softmax"; }
  std::string_view formula() const override { return "y = softmax(x) over the last dim"; }
  std::vector<std::string> size_names() const override { return {"rows", "cols"}; }
  std::vector<TensorSpec> tensors() const override {
    return {{"x", {"rows", "cols"}}, {"y", {"rows", "cols"}, true}};
  }

  std::vector<SizeCase> test_sizes() const override {
    return {
        {"tiny", {{"rows", 32}, {"cols", 128}}},      {"small", {{"rows", 256}, {"cols", 512}}},
        {"medium", {{"rows", 1024}, {"cols", 1024}}}, {"large", {{"rows", 4096}, {"cols", 4096}}},
        {"xlarge", {{"rows", 8192}, {"cols", 8192}}}, {"wide", {{"rows", 1024}, {"cols", 32768}}},
        {"narrow", {{"rows", 32768}, {"cols", 128}}}, {"vocab", {{"rows", 4096}, {"cols", 50257}}}};
  }
  std::vector<SizeCase> edge_sizes() const override {
    return {{"edge_1023", {{"rows", 1023}, {"cols", 1023}}},
            {"edge_4097", {{"rows", 4097}, {"cols", 4097}}},
            {"edge_50257", {{"rows", 1024}, {"cols", 50257}}},
            {"one_row", {{"rows", 1}, {"cols", 4096}}},
            {"one_col", {{"rows", 257}, {"cols", 1}}},
            {"prime_width", {{"rows", 7}, {"cols", 4099}}},
            {"tiny", {{"rows", 3}, {"cols", 5}}}};
  }
  std::vector<SizeCase> bench_sizes() const override { return test_sizes(); }
  Sizes default_size() const override { return {{"rows", 8192}, {"cols", 8192}}; }
  std::vector<DType> dtypes() const override { return {DType::f16, DType::bf16, DType::f32}; }
  Tolerance tolerance(DType dtype) const override {
    return tolerance_by_dtype(dtype, {1e-3, 1e-3}, {2e-3, 2e-3}, {1e-5, 1e-5});
  }
  std::vector<InputKind> stability_kinds() const override {
    auto kinds = OpSpec::stability_kinds();
    kinds.push_back(InputKind::very_negative);
    return kinds;
  }

  void reference(const Sizes& sizes, std::span<const std::vector<double>> in,
                 std::span<const double>, std::span<std::vector<double>> out) const override {
    const int64_t rows = sizes.at("rows"), cols = sizes.at("cols");
    const auto& x = in[0];
    auto& y = out[0];
    parallel_for(
        rows,
        [&](int64_t r) {
          const double* xr = x.data() + r * cols;
          double row_max = -INFINITY;
          for (int64_t c = 0; c < cols; ++c)
            row_max = std::max(row_max, xr[c]);
          double sum = 0;
          for (int64_t c = 0; c < cols; ++c)
            sum += std::exp(xr[c] - row_max);
          for (int64_t c = 0; c < cols; ++c)
            y[r * cols + c] = std::exp(xr[c] - row_max) / sum;
        },
        16);
  }

  Cost cost(const Sizes& sizes, DType dtype) const override {
    const double r = static_cast<double>(sizes.at("rows"));
    const double c = static_cast<double>(sizes.at("cols"));
    return {2 * r * c * static_cast<double>(dtype_size(dtype)), 5 * r * c};
  }
};

}  // namespace

std::unique_ptr<OpSpec> make_softmax_spec() {
  return std::make_unique<Softmax>();
}

}  // namespace kforge
