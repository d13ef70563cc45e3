// Op specs: references against independent formulations, cost models, generators, shapes.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "ops/op_spec.h"
#include "run/case_tensors.h"

namespace kforge {
namespace {

const OpSpec& op(const char* name) {
  const OpSpec* spec = find_op(name);
  EXPECT_NE(spec, nullptr) << name;
  return *spec;
}

std::vector<std::vector<double>> run_reference(const OpSpec& spec, const Sizes& sizes,
                                               CaseTensors& t) {
  std::vector<double> scalars;
  for (const auto& s : spec.scalars())
    scalars.push_back(s.value);
  std::vector<std::vector<double>> out;
  for (const auto& o : t.outputs())
    out.emplace_back(static_cast<size_t>(o.numel()));
  spec.reference(sizes, t.inputs_as_double(), scalars, out);
  return out;
}

TEST(Ops, RegistryKnowsRmsnormAndSoftmax) {
  EXPECT_NE(find_op("rmsnorm"), nullptr);
  EXPECT_NE(find_op("softmax"), nullptr);
  EXPECT_EQ(find_op("nope"), nullptr);
}

TEST(Ops, SoftmaxRowsArePositiveAndSumToOne) {
  const OpSpec& spec = op("softmax");
  const Sizes sizes = {{"rows", 7}, {"cols", 333}};
  CaseTensors t(spec, sizes, DType::f32);
  t.generate_inputs(InputKind::normal, 11);
  const auto y = run_reference(spec, sizes, t)[0];
  for (int r = 0; r < 7; ++r) {
    double sum = 0;
    for (int c = 0; c < 333; ++c) {
      EXPECT_GT(y[r * 333 + c], 0);
      sum += y[r * 333 + c];
    }
    EXPECT_NEAR(sum, 1.0, 1e-12);
  }
}

TEST(Ops, SoftmaxIsShiftInvariantAndStableForHugeLogits) {
  const OpSpec& spec = op("softmax");
  const Sizes sizes = {{"rows", 2}, {"cols", 3}};
  const std::vector<std::vector<double>> x = {{1, 2, 3, 1001, 1002, 1003}};
  std::vector<std::vector<double>> y = {std::vector<double>(6)};
  spec.reference(sizes, x, {}, y);
  const double e = std::exp(1.0);
  const double denominator = 1 + e + e * e;
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(y[0][r * 3 + 0], 1 / denominator, 1e-15);
    EXPECT_NEAR(y[0][r * 3 + 2], e * e / denominator, 1e-15);
  }
}

TEST(Ops, RmsnormNormalizesEachRowToUnitRms) {
  const OpSpec& spec = op("rmsnorm");
  const Sizes sizes = {{"M", 5}, {"N", 1000}};
  CaseTensors t(spec, sizes, DType::f32);
  t.generate_inputs(InputKind::normal, 5);
  const auto in = t.inputs_as_double();
  const auto y = run_reference(spec, sizes, t)[0];
  for (int r = 0; r < 5; ++r) {
    double mean_sq_x = 0, mean_sq_unweighted = 0;
    for (int c = 0; c < 1000; ++c)
      mean_sq_x += in[0][r * 1000 + c] * in[0][r * 1000 + c] / 1000;
    for (int c = 0; c < 1000; ++c) {
      const double x = in[0][r * 1000 + c];
      const double unweighted = y[r * 1000 + c] / in[1][c];
      mean_sq_unweighted += unweighted * unweighted / 1000;
      EXPECT_NEAR(unweighted * std::sqrt(mean_sq_x + 1e-6) - x, 0, 1e-3);  // direction kept
    }
    EXPECT_NEAR(mean_sq_unweighted, mean_sq_x / (mean_sq_x + 1e-6), 1e-9);
  }
}

TEST(Ops, GeneratorsAreFreshRandomAndNeverOnes) {
  const OpSpec& spec = op("rmsnorm");
  const Sizes sizes = {{"M", 64}, {"N", 256}};
  CaseTensors a(spec, sizes, DType::bf16), b(spec, sizes, DType::bf16), c(spec, sizes, DType::bf16);
  a.generate_inputs(InputKind::normal, 1);
  b.generate_inputs(InputKind::normal, 1);
  c.generate_inputs(InputKind::normal, 2);
  const auto xa = a.inputs_as_double(), xb = b.inputs_as_double(), xc = c.inputs_as_double();
  EXPECT_EQ(xa, xb);  // same seed, same inputs
  EXPECT_NE(xa[0], xc[0]);
  EXPECT_NE(xa[1], xc[1]);
  // The weight is random normal: spread around zero, not a constant.
  const auto& w = xa[1];
  const double mean = std::accumulate(w.begin(), w.end(), 0.0) / static_cast<double>(w.size());
  double var = 0;
  for (const double v : w)
    var += (v - mean) * (v - mean) / static_cast<double>(w.size());
  EXPECT_NEAR(mean, 0, 0.2);
  EXPECT_NEAR(var, 1, 0.3);
}

TEST(Ops, StabilityInputsStayInTheirRange) {
  const OpSpec& spec = op("rmsnorm");
  const Sizes sizes = {{"M", 4}, {"N", 1024}};
  for (const DType d : {DType::f16, DType::bf16, DType::f32}) {
    CaseTensors t(spec, sizes, d);
    t.generate_inputs(InputKind::near_max, 3);
    const double limit = spec.max_input_magnitude(sizes, d);
    const auto x = t.inputs_as_double()[0];
    double largest = 0;
    for (const double v : x) {
      ASSERT_TRUE(std::isfinite(v));
      largest = std::max(largest, std::abs(v));
      EXPECT_GE(std::abs(v), 0.49 * limit);
    }
    EXPECT_LE(largest, limit * 1.01);
    // Summing squares of a whole row stays finite in fp32.
    EXPECT_LT(largest * largest * 1024, 3.4e38);
  }
  CaseTensors zeros(spec, sizes, DType::f16);
  zeros.generate_inputs(InputKind::all_zeros, 3);
  const auto z = zeros.inputs_as_double()[0];
  for (const double v : z)
    EXPECT_EQ(v, 0);
  CaseTensors equal(spec, sizes, DType::f16);
  equal.generate_inputs(InputKind::all_equal, 3);
  const auto e = equal.inputs_as_double()[0];
  for (const double v : e)
    EXPECT_EQ(v, e[0]);
}

TEST(Ops, CostModels) {
  const Sizes square = {{"M", 8192}, {"N", 8192}};
  EXPECT_DOUBLE_EQ(op("rmsnorm").cost(square, DType::bf16).bytes, (2.0 * 8192 * 8192 + 8192) * 2);
  const Sizes sm = {{"rows", 8192}, {"cols", 8192}};
  EXPECT_DOUBLE_EQ(op("softmax").cost(sm, DType::f32).bytes, 2.0 * 8192 * 8192 * 4);
  // The matmul epilogues read their term once besides A and B and write C once.
  const Sizes mnk = {{"M", 4096}, {"N", 512}, {"K", 3584}};
  const double product_bytes = (4096.0 * 3584 + 3584.0 * 512 + 4096.0 * 512) * 2;
  EXPECT_DOUBLE_EQ(op("matmul_bias").cost(mnk, DType::bf16).bytes, product_bytes + 512 * 2);
  EXPECT_DOUBLE_EQ(op("matmul_residual").cost(mnk, DType::bf16).bytes,
                   product_bytes + 4096.0 * 512 * 2);
  EXPECT_DOUBLE_EQ(op("matmul_bias").cost(mnk, DType::bf16).flops,
                   op("matmul").cost(mnk, DType::bf16).flops + 4096.0 * 512);
}

// The matmul epilogues are tested and timed at matmul's sizes and at their models' layers.
TEST(Ops, MatmulEpiloguesTakeMatmulsSizesAndTheirModelShapes) {
  const OpSpec& matmul = op("matmul");
  for (const char* name : {"matmul_bias", "matmul_residual"}) {
    const OpSpec& spec = op(name);
    std::vector<std::string> shapes;
    for (const auto& s : spec.bench_sizes())
      shapes.push_back(spec.format_shape(s.sizes));
    for (const auto& s : matmul.test_sizes()) {
      EXPECT_NE(std::find(shapes.begin(), shapes.end(), matmul.format_shape(s.sizes)), shapes.end())
          << name << " " << s.label;
    }
    EXPECT_EQ(spec.edge_sizes().size(), matmul.edge_sizes().size()) << name;
  }
  const auto has = [](const OpSpec& spec, const char* shape) {
    for (const auto& s : spec.bench_sizes()) {
      if (spec.format_shape(s.sizes) == shape) return true;
    }
    return false;
  };
  EXPECT_EQ(op("matmul_bias").signature(), "A[M,K] B[K,N] bias[N] -> C[M,N]");
  EXPECT_EQ(op("matmul_residual").signature(), "A[M,K] B[K,N] R[M,N] -> C[M,N]");
  EXPECT_TRUE(has(op("matmul_bias"), "4096x512x3584"));        // Qwen2-7B k_proj, v_proj
  EXPECT_TRUE(has(op("matmul_residual"), "4096x3584x18944"));  // Qwen2-7B down_proj
}

TEST(Ops, ShapesParseAndFormat) {
  const OpSpec& spec = op("softmax");
  const Sizes s = spec.parse_shape("4096x50257");
  EXPECT_EQ(s.at("rows"), 4096);
  EXPECT_EQ(s.at("cols"), 50257);
  EXPECT_EQ(spec.format_shape(s), "4096x50257");
  EXPECT_THROW(spec.parse_shape("4096"), UsageError);
  EXPECT_THROW(spec.parse_shape("4096x0"), UsageError);
  EXPECT_THROW(spec.parse_shape("axb"), UsageError);
}

TEST(Ops, SizeSetsIncludeTheHeadlineAndEdges) {
  for (const char* name : {"rmsnorm", "softmax"}) {
    const OpSpec& spec = op(name);
    bool has_8192 = false;
    for (const auto& s : spec.bench_sizes()) {
      has_8192 = has_8192 || spec.format_shape(s.sizes) == "8192x8192";
    }
    EXPECT_TRUE(has_8192) << name;
    bool has_one_row = false, has_one_col = false;
    for (const auto& s : spec.edge_sizes()) {
      has_one_row = has_one_row || s.sizes.begin()->second == 1 || s.label == "one_row";
      has_one_col = has_one_col || s.label == "one_col";
    }
    EXPECT_TRUE(has_one_row && has_one_col) << name;
  }
}

}  // namespace
}  // namespace kforge
