// rotary_embedding: rotate pairs of x[b, h, s, :] by angles whose cos and sin are given per
// position: cos, sin [seq_len, head_dim / 2]. Two conventions, registered as two ops:
//   rotary_embedding       pairs (x[2i], x[2i+1])       (interleaved; AutoKernel's)
//   rotary_embedding_half  pairs (x[i], x[i + D/2])     (rotate-half; HF LLaMA's)
// In both, pair i at position s becomes (a cos - b sin, a sin + b cos) with cos[s, i], sin[s, i].
#include <cmath>

#include "core/parallel.h"
#include "core/random.h"
#include "ops/registry.h"

namespace kforge {
namespace {

Sizes bhsd(int64_t b, int64_t h, int64_t s, int64_t d) {
  return {{"batch", b}, {"heads", h}, {"seq_len", s}, {"head_dim", d}};
}

class RotaryEmbedding final : public OpSpec {
 public:
  explicit RotaryEmbedding(bool interleaved) : interleaved_(interleaved) {}

  std::string_view name() const override {
    return interleaved_ ? "rotary_embedding" : "rotary_embedding_half";
  }
  std::string_view formula() const override {
    return interleaved_ ? "rotate pairs (x[2i], x[2i+1]) by (cos, sin)[s, i]"
                        : "rotate pairs (x[i], x[i+D/2]) by (cos, sin)[s, i]";
  }
  std::vector<std::string> size_names() const override {
    return {"batch", "heads", "seq_len", "head_dim"};
  }
  std::vector<TensorSpec> tensors() const override {
    const std::vector<std::string> dims = {"batch", "heads", "seq_len", "head_dim"};
    return {{"x", dims},
            {"cos", {"seq_len", "half_dim"}, false, true},
            {"sin", {"seq_len", "half_dim"}, false, true},
            {"y", dims, true}};
  }
  std::vector<SizeCase> test_sizes() const override {
    return with_half({{"tiny", bhsd(1, 4, 64, 64)},
                      {"small", bhsd(2, 8, 256, 64)},
                      {"medium", bhsd(2, 16, 512, 64)},
                      {"large", bhsd(2, 32, 1024, 128)},
                      {"xlarge", bhsd(2, 32, 2048, 128)},
                      {"llm_7b", bhsd(1, 32, 2048, 128)},
                      {"llm_13b", bhsd(1, 40, 2048, 128)},
                      {"headline", bhsd(1, 32, 4096, 128)}});
  }
  std::vector<SizeCase> edge_sizes() const override {
    return with_half({{"edge_127", bhsd(1, 8, 127, 64)},
                      {"edge_1023", bhsd(1, 8, 1023, 128)},
                      {"one_token", bhsd(3, 5, 1, 64)},
                      {"small_head", bhsd(2, 3, 17, 2)}});
  }
  std::vector<SizeCase> bench_sizes() const override { return test_sizes(); }
  Sizes default_size() const override { return with_half({{"", bhsd(1, 32, 4096, 128)}})[0].sizes; }
  std::vector<DType> dtypes() const override { return {DType::f16, DType::bf16, DType::f32}; }
  Tolerance tolerance(DType dtype) const override {
    // bf16 keeps 8 significant bits: rounding alone moves a value by up to 2^-8 = 3.9e-3
    // of itself, so a tolerance below that would fail correctly rounded outputs.
    return tolerance_by_dtype(dtype, {1e-3, 1e-3}, {1e-2, 1e-2}, {1e-5, 1e-5});
  }
  // |y| <= sqrt(2) max|x|: keep it finite.
  double max_input_magnitude(const Sizes&, DType dtype) const override {
    return 0.6 * dtype_max(dtype);
  }

  // cos and sin are those of real RoPE angles, pos * 10000^(-2i/D), from a random starting
  // position, so a kernel that mixes up positions or frequencies is caught.
  void generate(const Sizes& sizes, InputKind kind, uint64_t seed,
                std::span<HostTensor> inputs) const override {
    OpSpec::generate(sizes, kind, seed, inputs.first(1));
    const int64_t s = sizes.at("seq_len"), half = sizes.at("head_dim") / 2;
    const double offset = std::floor(Rng(seed, 99).uniform() * 10000);
    for (int64_t p = 0; p < s; ++p) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle =
            (offset + static_cast<double>(p)) *
            std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(2 * half));
        store_element(inputs[1].data, inputs[1].dtype, static_cast<size_t>(p * half + i),
                      std::cos(angle));
        store_element(inputs[2].data, inputs[2].dtype, static_cast<size_t>(p * half + i),
                      std::sin(angle));
      }
    }
  }

  // cos and sin stay the tables generate() made (a rotation's); x is redrawn every sample. A
  // trap copies a few (cos, sin) entries of both tables from other positions.
  FreshInput fresh_input(size_t input, const Sizes& sizes) const override {
    if (input == 0) return OpSpec::fresh_input(input, sizes);
    FreshInput rule;
    rule.kind = FreshInput::Kind::keep;
    rule.row_length = sizes.at("half_dim");
    return rule;
  }

  void complete_sizes(Sizes& sizes) const override { sizes["half_dim"] = sizes.at("head_dim") / 2; }

  void reference(const Sizes& sizes, std::span<const std::vector<double>> in,
                 std::span<const double>, std::span<std::vector<double>> out) const override {
    const int64_t bh = sizes.at("batch") * sizes.at("heads"), s = sizes.at("seq_len"),
                  d = sizes.at("head_dim"), half = d / 2;
    const auto &x = in[0], &cos = in[1], &sin = in[2];
    auto& y = out[0];
    parallel_for(
        bh * s,
        [&](int64_t row) {
          const int64_t p = row % s;
          const double* xr = x.data() + row * d;
          double* yr = y.data() + row * d;
          for (int64_t i = 0; i < half; ++i) {
            const int64_t ia = interleaved_ ? 2 * i : i;
            const int64_t ib = interleaved_ ? 2 * i + 1 : i + half;
            const double c = cos[p * half + i], sn = sin[p * half + i];
            yr[ia] = xr[ia] * c - xr[ib] * sn;
            yr[ib] = xr[ia] * sn + xr[ib] * c;
          }
        },
        64);
  }

  Cost cost(const Sizes& sizes, DType dtype) const override {
    const double n = static_cast<double>(sizes.at("batch") * sizes.at("heads") *
                                         sizes.at("seq_len") * sizes.at("head_dim"));
    const double table = static_cast<double>(sizes.at("seq_len") * sizes.at("head_dim"));
    return {(2 * n + table) * static_cast<double>(dtype_size(dtype)), 3 * n};
  }

 private:
  // Adds the derived size half_dim = head_dim / 2 that cos and sin are shaped by.
  static std::vector<SizeCase> with_half(std::vector<SizeCase> cases) {
    for (auto& c : cases)
      c.sizes["half_dim"] = c.sizes.at("head_dim") / 2;  // as complete_sizes
    return cases;
  }

  bool interleaved_;
};

}  // namespace

std::unique_ptr<OpSpec> make_rotary_embedding_spec() {
  return std::make_unique<RotaryEmbedding>(true);
}
std::unique_ptr<OpSpec> make_rotary_embedding_half_spec() {
  return std::make_unique<RotaryEmbedding>(false);
}

}  // namespace kforge
