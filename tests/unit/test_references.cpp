// Every float64 reference against an independent formulation built from other ops' references
// or from the op's mathematical properties, on small problems.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "ops/op_spec.h"
#include "run/case_tensors.h"

namespace kforge {
namespace {

using Tensors = std::vector<std::vector<double>>;

const OpSpec& op(const char* name) {
  return *find_op(name);
}

// Inputs drawn by the op's own generator, widened to double.
Tensors inputs(const OpSpec& spec, const Sizes& sizes, uint64_t seed,
               InputKind kind = InputKind::normal) {
  CaseTensors t(spec, sizes, DType::f32);
  t.generate_inputs(kind, seed);
  return t.inputs_as_double();
}

// The reference's outputs; with `magnitudes`, followed by each output's magnitudes (for ops
// whose tolerance is relative to them).
Tensors run(const OpSpec& spec, const Sizes& sizes, const Tensors& in, bool magnitudes = false) {
  CaseTensors shapes(spec, sizes, DType::f32);
  Tensors out;
  for (int copy = 0; copy < (magnitudes ? 2 : 1); ++copy) {
    for (const auto& t : shapes.outputs())
      out.emplace_back(static_cast<size_t>(t.numel()));
  }
  spec.reference(sizes, in, spec.scalar_values(sizes), out);
  return out;
}

std::vector<double> transpose(const std::vector<double>& m, int64_t rows, int64_t cols) {
  std::vector<double> t(m.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c)
      t[c * rows + r] = m[r * cols + c];
  }
  return t;
}

std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int64_t m,
                           int64_t n, int64_t k) {
  return run(op("matmul"), {{"M", m}, {"N", n}, {"K", k}}, {a, b})[0];
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "at " << i;
  }
}

TEST(References, MatmulTransposeIdentity) {
  const int64_t m = 13, n = 17, k = 11;
  const Sizes sizes = {{"M", m}, {"N", n}, {"K", k}};
  const Tensors in = inputs(op("matmul"), sizes, 1);
  const auto c = run(op("matmul"), sizes, in)[0];
  // C^T = B^T A^T, computed by the same op with roles swapped.
  const auto ct = matmul(transpose(in[1], k, n), transpose(in[0], m, k), n, m, k);
  expect_near_all(transpose(ct, n, m), c, 1e-12);
  // One element by hand.
  double c00 = 0;
  for (int64_t p = 0; p < k; ++p)
    c00 += in[0][p] * in[1][p * n];
  EXPECT_NEAR(c[0], c00, 1e-12);
}

// matmul_bias and matmul_residual are matmul plus the added term, which must be there: the
// bias of column j on every row, R element by element. Their magnitudes are the root-sum-square
// of the K products and the term.
TEST(References, MatmulEpiloguesAddTheirTermToTheProduct) {
  const int64_t m = 5, n = 7, k = 3;
  const Sizes sizes = {{"M", m}, {"N", n}, {"K", k}};
  for (const char* name : {"matmul_bias", "matmul_residual"}) {
    const OpSpec& spec = op(name);
    ASSERT_TRUE(spec.tolerance_relative_to_magnitude()) << name;
    const Tensors in = inputs(spec, sizes, 4);
    const bool bias = std::string(name) == "matmul_bias";
    ASSERT_EQ(in[2].size(), static_cast<size_t>(bias ? n : m * n)) << name;
    const Tensors c = run(spec, sizes, in, true);
    const Tensors product = run(op("matmul"), sizes, {in[0], in[1]}, true);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const size_t at = static_cast<size_t>(i * n + j);
        const double term = in[2][static_cast<size_t>(bias ? j : i * n + j)];
        ASSERT_GT(std::abs(term), 1e-3) << name;  // a forgotten term would show
        EXPECT_NEAR(c[0][at], product[0][at] + term, 1e-12) << name << " at " << at;
        EXPECT_NEAR(c[1][at], std::sqrt(product[1][at] * product[1][at] + term * term), 1e-12)
            << name << " magnitude at " << at;
      }
    }
    // All-zero activations leave the bias (a parameter, drawn normal whatever the inputs)
    // alone, and zero the residual with the rest.
    const Tensors zeros = inputs(spec, sizes, 4, InputKind::all_zeros);
    const Tensors z = run(spec, sizes, zeros);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j)
        EXPECT_EQ(z[0][i * n + j], bias ? zeros[2][j] : 0.0) << name;
    }
  }
}

TEST(References, AttentionEqualsSoftmaxOfScoresTimesV) {
  for (const int64_t causal : {0, 1}) {
    const int64_t s = 9, d = 8;
    const Sizes sizes = {{"batch", 1},    {"heads", 2},       {"seq_len", s},
                         {"head_dim", d}, {"causal", causal}, {"scale_permille", 300},
                         {"kv_heads", 2}};
    const Tensors in = inputs(op("flash_attention"), sizes, 2);
    const auto o = run(op("flash_attention"), sizes, in)[0];
    for (int64_t h = 0; h < 2; ++h) {
      const auto slice = [&](const std::vector<double>& t) {
        return std::vector<double>(t.begin() + h * s * d, t.begin() + (h + 1) * s * d);
      };
      auto scores = matmul(slice(in[0]), transpose(slice(in[1]), s, d), s, s, d);
      for (int64_t i = 0; i < s; ++i) {
        for (int64_t j = 0; j < s; ++j) {
          scores[i * s + j] = (causal && j > i) ? -INFINITY : 0.3 * scores[i * s + j];
        }
      }
      const auto p = run(op("softmax"), {{"rows", s}, {"cols", s}}, {scores})[0];
      const auto expected = matmul(p, slice(in[2]), s, d, s);
      expect_near_all(slice(o), expected, 1e-12);
    }
  }
}

// Attention's magnitudes are those of the product P V as a matmul: the root-sum-square of
// each output's terms p_j v_j.
TEST(References, AttentionMagnitudesAreThoseOfThePVProduct) {
  ASSERT_TRUE(op("flash_attention").tolerance_relative_to_magnitude());
  const int64_t s = 7, d = 4;
  const Sizes sizes = {{"batch", 1},    {"heads", 1},  {"seq_len", s},
                       {"head_dim", d}, {"causal", 1}, {"scale_permille", 500},
                       {"kv_heads", 1}};
  const Tensors in = inputs(op("flash_attention"), sizes, 3, InputKind::mixed_scales);
  const Tensors o = run(op("flash_attention"), sizes, in, true);
  auto scores = matmul(in[0], transpose(in[1], s, d), s, s, d);
  for (int64_t i = 0; i < s; ++i) {
    for (int64_t j = 0; j < s; ++j)
      scores[i * s + j] = j > i ? -INFINITY : 0.5 * scores[i * s + j];
  }
  const auto p = run(op("softmax"), {{"rows", s}, {"cols", s}}, {scores})[0];
  const Tensors pv = run(op("matmul"), {{"M", s}, {"N", d}, {"K", s}}, {p, in[2]}, true);
  expect_near_all(o[0], pv[0], 1e-12);
  expect_near_all(o[1], pv[1], 1e-12);
}

// Grouped-query attention is attention with each key/value head repeated for its group of
// query heads (as HF's repeat_kv does): query head h reads key/value head h / (heads / kv_heads).
TEST(References, GroupedQueryAttentionEqualsRepeatedKeyValueHeads) {
  for (const int64_t causal : {0, 1}) {
    const int64_t b = 2, h = 6, kv = 2, s = 7, d = 8, group = h / kv;
    const Sizes gqa = {{"batch", b},       {"heads", h},          {"seq_len", s},  {"head_dim", d},
                       {"causal", causal}, {"scale_permille", 0}, {"kv_heads", kv}};
    Sizes mha = gqa;
    mha["kv_heads"] = h;
    const Tensors in = inputs(op("flash_attention"), gqa, 5);
    ASSERT_EQ(in[1].size(), static_cast<size_t>(b * kv * s * d));
    // K and V with every head repeated `group` times: [b, h, s, d].
    Tensors repeated = {in[0], {}, {}};
    for (const int t : {1, 2}) {
      for (int64_t bi = 0; bi < b; ++bi) {
        for (int64_t hi = 0; hi < h; ++hi) {
          const auto first = in[t].begin() + ((bi * kv + hi / group) * s * d);
          repeated[t].insert(repeated[t].end(), first, first + s * d);
        }
      }
    }
    expect_near_all(run(op("flash_attention"), gqa, in)[0],
                    run(op("flash_attention"), mha, repeated)[0], 1e-12);
  }
  EXPECT_THROW(op("flash_attention").parse_shape("1x6x64x64,kv_heads=4"), UsageError);
  const Sizes parsed = op("flash_attention").parse_shape("1x28x64x128,kv_heads=4");
  EXPECT_EQ(op("flash_attention").format_shape(parsed),
            "1x28x64x128,causal=1,kv_heads=4,scale_permille=0");
  // Without grouped queries the shape reads as before the size existed.
  EXPECT_EQ(op("flash_attention").format_shape(op("flash_attention").parse_shape("1x8x64x64")),
            "1x8x64x64,causal=1,scale_permille=0");
}

TEST(References, AttentionCausalFlopsCountHalfTheSquare) {
  const Sizes causal = op("flash_attention").parse_shape("4x32x4096x128,causal=1");
  const Sizes full = op("flash_attention").parse_shape("4x32x4096x128,causal=0");
  const double f = op("flash_attention").cost(full, DType::bf16).flops;
  const double c = op("flash_attention").cost(causal, DType::bf16).flops;
  EXPECT_DOUBLE_EQ(f, 4.0 * 4 * 32 * 4096.0 * 4096 * 128);
  EXPECT_DOUBLE_EQ(c, 4.0 * 4 * 32 * (4096.0 * 4097 / 2) * 128);
}

TEST(References, CrossEntropyIsMinusLogSoftmaxAtTheTarget) {
  const int64_t b = 40, v = 33;
  const Sizes sizes = {{"batch", b}, {"vocab", v}};
  const Tensors in = inputs(op("cross_entropy"), sizes, 3);
  const double loss = run(op("cross_entropy"), sizes, in)[0][0];
  const auto p = run(op("softmax"), {{"rows", b}, {"cols", v}}, {in[0]})[0];
  double sum = 0;
  int counted = 0;
  for (int64_t r = 0; r < b; ++r) {
    const auto t = static_cast<int64_t>(in[1][r]);
    if (t == -100) continue;
    ASSERT_GE(t, 0);
    ASSERT_LT(t, v);
    sum += -std::log(p[r * v + t]);
    ++counted;
  }
  EXPECT_GT(counted, 0);
  EXPECT_NEAR(loss, sum / counted, 1e-12);
  // Every row ignored: the mean of nothing is NaN, as in PyTorch.
  const Tensors masked = inputs(op("cross_entropy"), sizes, 3, InputKind::fully_masked);
  EXPECT_TRUE(std::isnan(run(op("cross_entropy"), sizes, masked)[0][0]));
}

TEST(References, FusedMlpEqualsThreeMatmuls) {
  const int64_t b = 5, d = 12, h = 20;
  const Sizes sizes = {{"batch", b}, {"dim", d}, {"hidden", h}};
  const Tensors in = inputs(op("fused_mlp"), sizes, 4);
  const auto y = run(op("fused_mlp"), sizes, in)[0];
  const auto gate = matmul(in[0], transpose(in[1], h, d), b, h, d);
  const auto up = matmul(in[0], transpose(in[2], h, d), b, h, d);
  std::vector<double> act(gate.size());
  for (size_t i = 0; i < act.size(); ++i)
    act[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
  expect_near_all(y, matmul(act, transpose(in[3], d, h), b, d, h), 1e-12);
}

TEST(References, LayernormRowsHaveZeroMeanUnitVariance) {
  const int64_t b = 6, d = 50;
  const Sizes sizes = {{"batch", b}, {"dim", d}};
  const Tensors in = inputs(op("layernorm"), sizes, 5);
  const auto y = run(op("layernorm"), sizes, in)[0];
  for (int64_t r = 0; r < b; ++r) {
    double mean_x = 0, var_x = 0, mean_z = 0, var_z = 0;
    for (int64_t j = 0; j < d; ++j)
      mean_x += in[0][r * d + j] / d;
    for (int64_t j = 0; j < d; ++j)
      var_x += std::pow(in[0][r * d + j] - mean_x, 2) / d;
    for (int64_t j = 0; j < d; ++j)
      mean_z += (y[r * d + j] - in[2][j]) / in[1][j] / d;
    for (int64_t j = 0; j < d; ++j)
      var_z += std::pow((y[r * d + j] - in[2][j]) / in[1][j], 2) / d;
    EXPECT_NEAR(mean_z, 0, 1e-9);
    EXPECT_NEAR(var_z, var_x / (var_x + 1e-5), 1e-9);
  }
}

TEST(References, RopeKeepsPairNormsAndTheTwoConventionsAgreeUpToLayout) {
  const int64_t s = 7, d = 8, half = 4;
  const Sizes sizes = op("rotary_embedding").parse_shape("1x2x7x8");
  const Tensors in = inputs(op("rotary_embedding"), sizes, 6);
  const auto y = run(op("rotary_embedding"), sizes, in)[0];
  for (int64_t row = 0; row < 2 * s; ++row) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = in[0][row * d + 2 * i], b = in[0][row * d + 2 * i + 1];
      const double ya = y[row * d + 2 * i], yb = y[row * d + 2 * i + 1];
      // cos and sin are rounded to fp32, so cos^2 + sin^2 = 1 only to ~1e-7.
      EXPECT_NEAR(ya * ya + yb * yb, a * a + b * b, 1e-6 * (a * a + b * b));
      const int64_t p = row % s;
      EXPECT_NEAR(
          in[1][p * half + i] * in[1][p * half + i] + in[2][p * half + i] * in[2][p * half + i],
          1.0, 1e-6);
    }
  }
  // Deinterleave x: rotate-half on the permuted input equals the permuted interleaved output.
  std::vector<double> x_half(in[0].size()), y_perm(y.size());
  for (int64_t row = 0; row < 2 * s; ++row) {
    for (int64_t i = 0; i < half; ++i) {
      x_half[row * d + i] = in[0][row * d + 2 * i];
      x_half[row * d + i + half] = in[0][row * d + 2 * i + 1];
      y_perm[row * d + i] = y[row * d + 2 * i];
      y_perm[row * d + i + half] = y[row * d + 2 * i + 1];
    }
  }
  const auto y_half = run(op("rotary_embedding_half"), sizes, {x_half, in[1], in[2]})[0];
  expect_near_all(y_half, y_perm, 1e-12);
}

TEST(References, ReduceEqualsMatmulWithOnes) {
  const int64_t m = 9, n = 31;
  const Sizes sizes = {{"M", m}, {"N", n}};
  const Tensors in = inputs(op("reduce"), sizes, 7);
  const auto y = run(op("reduce"), sizes, in)[0];
  expect_near_all(y, matmul(in[0], std::vector<double>(n, 1.0), m, 1, n), 1e-12);
}

TEST(References, ReduceCancellingInputsOverflowFp16PartialSums) {
  const int64_t n = 1024;
  CaseTensors t(op("reduce"), {{"M", 2}, {"N", n}}, DType::f16);
  t.generate_inputs(InputKind::cancelling, 8);
  const auto x = t.inputs_as_double()[0];
  double partial = 0, peak = 0;
  for (int64_t j = 0; j < n; ++j)
    peak = std::max(peak, std::abs(partial += x[j]));
  EXPECT_GT(peak, 65504.0);  // an fp16 running sum would overflow
  EXPECT_LT(peak, 3.4e38);   // an fp32 one does not
}

}  // namespace
}  // namespace kforge
