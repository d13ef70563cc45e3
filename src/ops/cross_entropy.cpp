// cross_entropy: loss = mean over rows r with targets[r] != -100 of
//   logsumexp(logits[r, :]) - logits[r, targets[r]]
// as PyTorch's F.cross_entropy(reduction="mean", ignore_index=-100): ignored rows count neither
// in the sum nor in the divisor, and a batch with every row ignored gives NaN.
#include <cmath>

#include "core/parallel.h"
#include "core/random.h"
#include "ops/registry.h"

namespace kforge {
namespace {

constexpr int64_t kIgnoreIndex = -100;

Sizes bv(int64_t b, int64_t v) {
  return {{"batch", b}, {"vocab", v}};
}

class CrossEntropy final : public OpSpec {
 public:
  std::string_view name() const override { return "cross_entropy"; }
  std::string_view formula() const override {
    return "loss = mean(logsumexp(logits) - logits[target]), rows with target -100 ignored";
  }
  std::vector<std::string> size_names() const override { return {"batch", "vocab"}; }
  std::vector<TensorSpec> tensors() const override {
    return {{"logits", {"batch", "vocab"}},
            {"targets", {"batch"}, false, false, DType::i64},
            {"loss", {}, true}};
  }
  std::vector<SizeCase> test_sizes() const override {
    return {{"tiny", bv(32, 256)},        {"small", bv(256, 1024)},    {"medium", bv(1024, 4096)},
            {"large", bv(4096, 32000)},   {"xlarge", bv(8192, 50257)}, {"gpt2", bv(4096, 50257)},
            {"headline", bv(8192, 32768)}};
  }
  std::vector<SizeCase> edge_sizes() const override {
    return {{"edge_1023", bv(1023, 32000)},
            {"edge_50257", bv(4096, 50257)},
            {"one_row", bv(1, 4096)},
            {"one_class", bv(37, 1)},
            {"prime_vocab", bv(7, 4099)}};
  }
  std::vector<SizeCase> bench_sizes() const override { return test_sizes(); }
  Sizes default_size() const override { return bv(8192, 32768); }
  std::vector<DType> dtypes() const override { return {DType::f16, DType::bf16, DType::f32}; }
  Tolerance tolerance(DType dtype) const override {
    return tolerance_by_dtype(dtype, {1e-2, 1e-2}, {2e-2, 2e-2}, {1e-5, 1e-5});
  }
  std::vector<InputKind> stability_kinds() const override {
    return {InputKind::near_max,  InputKind::very_negative, InputKind::mixed_scales,
            InputKind::all_zeros, InputKind::all_equal,     InputKind::fully_masked};
  }
  // The loss is a difference of values of the logits' size; keep it finite in the output dtype.
  double max_input_magnitude(const Sizes&, DType dtype) const override {
    return 0.25 * dtype_max(dtype);
  }

  void generate(const Sizes& sizes, InputKind kind, uint64_t seed,
                std::span<HostTensor> inputs) const override {
    OpSpec::generate(sizes, kind, seed, inputs.first(1));
    HostTensor& targets = inputs[1];
    const int64_t vocab = sizes.at("vocab");
    Rng rng(seed, 77);
    for (int64_t r = 0; r < targets.numel(); ++r) {
      const auto target = static_cast<int64_t>(rng.uniform() * static_cast<double>(vocab));
      // About one row in sixteen is ignored, as padding would be.
      const bool ignored = kind == InputKind::fully_masked || rng.uniform() < 1.0 / 16;
      store_element(targets.data, DType::i64, static_cast<size_t>(r),
                    static_cast<double>(ignored ? kIgnoreIndex : std::min(target, vocab - 1)));
    }
  }

  // Timed samples draw targets as generate() does: uniform classes, about one row in sixteen
  // ignored.
  FreshInput fresh_input(size_t input, const Sizes& sizes) const override {
    if (input == 0) return OpSpec::fresh_input(input, sizes);
    FreshInput rule;
    rule.kind = FreshInput::Kind::index;
    rule.bound = sizes.at("vocab");
    rule.special = kIgnoreIndex;
    rule.special_share = 1.0 / 16;
    return rule;
  }

  void reference(const Sizes& sizes, std::span<const std::vector<double>> in,
                 std::span<const double>, std::span<std::vector<double>> out) const override {
    const int64_t b = sizes.at("batch"), v = sizes.at("vocab");
    std::vector<double> row_loss(static_cast<size_t>(b), 0.0);
    std::vector<char> counted(static_cast<size_t>(b), 0);
    parallel_for(
        b,
        [&](int64_t r) {
          const auto target = static_cast<int64_t>(in[1][r]);
          if (target == kIgnoreIndex) return;
          const double* x = in[0].data() + r * v;
          double best = -INFINITY;
          for (int64_t j = 0; j < v; ++j)
            best = std::max(best, x[j]);
          double sum = 0;
          for (int64_t j = 0; j < v; ++j)
            sum += std::exp(x[j] - best);
          row_loss[r] = best + std::log(sum) - x[target];
          counted[r] = 1;
        },
        16);
    double total = 0;
    int64_t n = 0;
    for (int64_t r = 0; r < b; ++r) {
      total += row_loss[r];
      n += counted[r];
    }
    out[0][0] = n > 0 ? total / static_cast<double>(n) : NAN;
  }

  Cost cost(const Sizes& sizes, DType dtype) const override {
    const double b = static_cast<double>(sizes.at("batch")),
                 v = static_cast<double>(sizes.at("vocab"));
    return {b * v * static_cast<double>(dtype_size(dtype)) + b * 8, 4 * b * v};
  }
};

}  // namespace

std::unique_ptr<OpSpec> make_cross_entropy_spec() {
  return std::make_unique<CrossEntropy>();
}

}  // namespace kforge
