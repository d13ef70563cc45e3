// reduce: y[m] = sum_n x[m, n]
#include <cmath>

#include "core/parallel.h"
#include "ops/registry.h"

namespace kforge {
namespace {

class Reduce final : public OpSpec {
 public:
  std::string_view name() const override { return "reduce"; }
  std::string_view formula() const override { return "y = sum(x) over the last dim"; }
  std::vector<std::string> size_names() const override { return {"M", "N"}; }
  std::vector<TensorSpec> tensors() const override {
    return {{"x", {"M", "N"}}, {"y", {"M"}, true}};
  }
  std::vector<SizeCase> test_sizes() const override {
    return {{"small", {{"M", 1024}, {"N", 1024}}},
            {"medium", {{"M", 4096}, {"N", 4096}}},
            {"large", {{"M", 8192}, {"N", 8192}}},
            {"wide", {{"M", 1024}, {"N", 32768}}},
            {"headline", {{"M", 16384}, {"N", 4096}}}};
  }
  std::vector<SizeCase> edge_sizes() const override {
    return {{"edge_1023", {{"M", 1023}, {"N", 1024}}}, {"edge_4097", {{"M", 4096}, {"N", 4097}}},
            {"one_row", {{"M", 1}, {"N", 4096}}},      {"one_col", {{"M", 257}, {"N", 1}}},
            {"prime_width", {{"M", 7}, {"N", 4099}}},  {"tiny", {{"M", 3}, {"N", 5}}}};
  }
  std::vector<SizeCase> bench_sizes() const override { return test_sizes(); }
  Sizes default_size() const override { return {{"M", 16384}, {"N", 4096}}; }
  std::vector<DType> dtypes() const override { return {DType::f16, DType::bf16, DType::f32}; }
  Tolerance tolerance(DType dtype) const override {
    return tolerance_by_dtype(dtype, {1e-2, 1e-2}, {5e-2, 5e-2}, {1e-4, 1e-5});
  }
  // A row sum's rounding error scales with sum |x|, not with the (possibly cancelled) result,
  // so the tolerance is relative to that.
  bool tolerance_relative_to_magnitude() const override { return true; }
  std::vector<InputKind> stability_kinds() const override {
    auto kinds = OpSpec::stability_kinds();
    kinds.push_back(InputKind::cancelling);
    return kinds;
  }
  // The row sum must fit in the output dtype and in fp32.
  double max_input_magnitude(const Sizes& sizes, DType dtype) const override {
    return 0.5 * dtype_max(dtype) / static_cast<double>(sizes.at("N"));
  }

  void reference(const Sizes& sizes, std::span<const std::vector<double>> in,
                 std::span<const double>, std::span<std::vector<double>> out) const override {
    const int64_t m = sizes.at("M"), n = sizes.at("N");
    parallel_for(
        m,
        [&](int64_t r) {
          double sum = 0, magnitude = 0;
          for (int64_t j = 0; j < n; ++j) {
            sum += in[0][r * n + j];
            magnitude += std::abs(in[0][r * n + j]);
          }
          out[0][r] = sum;
          if (out.size() > 1) out[1][r] = magnitude;
        },
        16);
  }

  Cost cost(const Sizes& sizes, DType dtype) const override {
    const double m = static_cast<double>(sizes.at("M")), n = static_cast<double>(sizes.at("N"));
    return {(m * n + m) * static_cast<double>(dtype_size(dtype)), m * n};
  }
};

}  // namespace

std::unique_ptr<OpSpec> make_reduce_spec() {
  return std::make_unique<Reduce>();
}

}  // namespace kforge
