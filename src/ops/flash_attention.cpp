// flash_attention: O[b, h, i, :] = softmax_j(sm_scale * Q[b, h, i, :] . K[b, g, j, :]) V[b, g, j,
// :] over j <= i when causal, where g = h / (heads / kv_heads) is the key/value head query head
// h reads. Named sizes: causal (default 1), scale_permille (0: the default 1/sqrt(head_dim);
// otherwise sm_scale = scale_permille / 1000, so kernels must honour it) and kv_heads (grouped-
// query attention, as Llama-3, Mistral and Qwen2 use: K and V have kv_heads heads, each shared
// by heads / kv_heads consecutive query heads; 0, the default, means kv_heads = heads).
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

#include "core/parallel.h"
#include "ops/registry.h"

namespace kforge {
namespace {

Sizes bhsd(int64_t b, int64_t h, int64_t s, int64_t d, int64_t causal, int64_t scale = 0,
           int64_t kv_heads = 0) {
  return {{"batch", b},
          {"heads", h},
          {"seq_len", s},
          {"head_dim", d},
          {"causal", causal},
          {"scale_permille", scale},
          {"kv_heads", kv_heads > 0 ? kv_heads : h}};
}

// kv_heads, or heads where it is left out or 0 (attention without grouped queries).
int64_t kv_heads_of(const Sizes& sizes) {
  const auto it = sizes.find("kv_heads");
  return it != sizes.end() && it->second > 0 ? it->second : sizes.at("heads");
}

class FlashAttention final : public OpSpec {
 public:
  std::string_view name() const override { return "flash_attention"; }
  std::string_view formula() const override {
    return "O = softmax(sm_scale * Q K^T [causal mask]) V";
  }
  std::vector<std::string> size_names() const override {
    return {"batch", "heads", "seq_len", "head_dim"};
  }
  Sizes named_size_defaults() const override {
    return {{"causal", 1}, {"scale_permille", 0}, {"kv_heads", 0}};
  }
  void complete_sizes(Sizes& sizes) const override {
    const int64_t heads = sizes.at("heads");
    int64_t& kv_heads = sizes["kv_heads"];
    if (kv_heads == 0) kv_heads = heads;
    if (heads % kv_heads != 0) {
      throw UsageError(fmt::format(
          "flash_attention: heads ({}) must be a multiple of kv_heads ({})", heads, kv_heads));
    }
  }
  bool named_size_implied(const std::string& name, const Sizes& sizes) const override {
    if (name != "kv_heads") return false;
    const auto it = sizes.find("kv_heads");
    return it == sizes.end() || it->second == 0 || it->second == sizes.at("heads");
  }
  std::vector<TensorSpec> tensors() const override {
    const std::vector<std::string> dims = {"batch", "heads", "seq_len", "head_dim"};
    const std::vector<std::string> kv_dims = {"batch", "kv_heads", "seq_len", "head_dim"};
    return {{"Q", dims}, {"K", kv_dims}, {"V", kv_dims}, {"O", dims, true}};
  }
  std::vector<ScalarSpec> scalars() const override { return {{"sm_scale", 0}, {"causal", 1}}; }
  std::vector<double> scalar_values(const Sizes& sizes) const override {
    const int64_t permille = sizes.contains("scale_permille") ? sizes.at("scale_permille") : 0;
    const double scale = permille > 0 ? static_cast<double>(permille) / 1000.0
                                      : 1.0 / std::sqrt(static_cast<double>(sizes.at("head_dim")));
    return {scale, static_cast<double>(sizes.contains("causal") ? sizes.at("causal") : 1)};
  }

  std::vector<SizeCase> test_sizes() const override {
    return {{"tiny", bhsd(1, 4, 64, 64, 1)},
            {"tiny_full", bhsd(1, 4, 64, 64, 0)},
            {"small", bhsd(2, 8, 256, 64, 0)},
            {"medium", bhsd(2, 16, 512, 64, 1)},
            {"large", bhsd(2, 32, 1024, 64, 1)},
            {"xlarge", bhsd(2, 32, 2048, 64, 1)},
            {"long", bhsd(1, 32, 4096, 64, 1)},
            {"gqa", bhsd(2, 32, 1024, 128, 0, 0, 8)},
            {"gqa_causal", bhsd(1, 28, 512, 128, 1, 0, 4)},
            {"llm_7b", bhsd(1, 32, 2048, 128, 1)},
            {"headline", bhsd(4, 32, 4096, 128, 1)},
            {"custom_scale", bhsd(1, 8, 256, 64, 1, 50)}};
  }
  std::vector<SizeCase> edge_sizes() const override {
    return {
        {"edge_127", bhsd(1, 8, 127, 64, 1)},       {"edge_127_full", bhsd(1, 8, 127, 64, 0)},
        {"edge_1023", bhsd(1, 8, 1023, 64, 1)},     {"edge_1023_d128", bhsd(1, 2, 1023, 128, 0)},
        {"one_token", bhsd(2, 3, 1, 64, 1)},        {"odd_heads", bhsd(3, 5, 65, 64, 0)},
        {"edge_gqa", bhsd(2, 6, 127, 64, 1, 0, 2)}, {"one_kv_head", bhsd(1, 4, 65, 64, 0, 0, 1)}};
  }
  std::vector<SizeCase> bench_sizes() const override { return test_sizes(); }
  Sizes default_size() const override { return bhsd(4, 32, 4096, 128, 1); }
  std::vector<DType> dtypes() const override { return {DType::f16, DType::bf16}; }
  Tolerance tolerance(DType dtype) const override {
    return dtype == DType::f16 ? Tolerance{1e-2, 1e-2} : Tolerance{2e-2, 2e-2};
  }
  std::vector<InputKind> stability_kinds() const override {
    // Huge and very negative scores test the running max; equal rows the normalization.
    return {InputKind::near_max, InputKind::very_negative, InputKind::mixed_scales,
            InputKind::all_zeros, InputKind::all_equal};
  }
  // Scores are dot products over head_dim times sm_scale; keep them finite in fp32.
  double max_input_magnitude(const Sizes& sizes, DType dtype) const override {
    const double d = static_cast<double>(sizes.at("head_dim"));
    return std::min(0.9 * dtype_max(dtype), 0.5 * std::sqrt(1e30 / d));
  }

  // An output element is a weighted sum over keys, sum_j p_j v_j. Tensor-core kernels (as every
  // flash attention on them) round p to the input type before the P V product, an error of
  // about eps * sqrt(sum_j (p_j v_j)^2) that a cancelling sum (values of 1e3 and -1e3) cannot
  // hide: the tolerance is relative to that root-sum-square, as for a matmul's dot products.
  bool tolerance_relative_to_magnitude() const override { return true; }

  void reference(const Sizes& sizes, std::span<const std::vector<double>> in,
                 std::span<const double> scalars,
                 std::span<std::vector<double>> out) const override {
    const int64_t b = sizes.at("batch"), h = sizes.at("heads"), s = sizes.at("seq_len"),
                  d = sizes.at("head_dim"), kv = kv_heads_of(sizes);
    const double scale = scalars[0];
    const bool causal = scalars[1] != 0;
    const auto &q = in[0], &k = in[1], &v = in[2];
    auto& o = out[0];
    parallel_for(b * h * s, [&](int64_t row) {
      const int64_t head = row / s, i = row % s;  // head: batch * heads + query head
      const int64_t kv_head = head / h * kv + head % h / (h / kv);
      const double* qi = q.data() + row * d;
      const double* kh = k.data() + kv_head * s * d;
      const double* vh = v.data() + kv_head * s * d;
      const int64_t last = causal ? i : s - 1;
      std::vector<double> p(static_cast<size_t>(last + 1));
      double best = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        double dot = 0;
        for (int64_t t = 0; t < d; ++t)
          dot += qi[t] * kh[j * d + t];
        p[j] = scale * dot;
        best = std::max(best, p[j]);
      }
      double sum = 0;
      for (auto& x : p)
        sum += (x = std::exp(x - best));
      for (auto& x : p)
        x /= sum;  // the probabilities
      double* oi = o.data() + row * d;
      std::fill(oi, oi + d, 0.0);
      for (int64_t j = 0; j <= last; ++j) {
        for (int64_t t = 0; t < d; ++t)
          oi[t] += p[j] * vh[j * d + t];
      }
      if (out.size() > 1) {  // the root-sum-square of each output's terms
        double* rss = out[1].data() + row * d;
        std::fill(rss, rss + d, 0.0);
        for (int64_t j = 0; j <= last; ++j) {
          for (int64_t t = 0; t < d; ++t)
            rss[t] += p[j] * p[j] * vh[j * d + t] * vh[j * d + t];
        }
        for (int64_t t = 0; t < d; ++t)
          rss[t] = std::sqrt(rss[t]);
      }
    });
  }

  // Causal attention computes half the score matrix (the diagonal included).
  Cost cost(const Sizes& sizes, DType dtype) const override {
    const double b = static_cast<double>(sizes.at("batch")),
                 h = static_cast<double>(sizes.at("heads")),
                 s = static_cast<double>(sizes.at("seq_len")),
                 d = static_cast<double>(sizes.at("head_dim"));
    const bool causal = !sizes.contains("causal") || sizes.at("causal") != 0;
    const double kv = static_cast<double>(kv_heads_of(sizes));
    const double pairs = causal ? s * (s + 1) / 2 : s * s;
    // Q and O for every query head; K and V once per key/value head.
    return {(2 * h + 2 * kv) * b * s * d * static_cast<double>(dtype_size(dtype)),
            4 * b * h * pairs * d};
  }
};

}  // namespace

std::unique_ptr<OpSpec> make_flash_attention_spec() {
  return std::make_unique<FlashAttention>();
}

}  // namespace kforge
