// KernelBench problems as op specs, without Python: the op built from a problem's description
// (what kernelbench_problem.py's "describe" replies), its sizes read off the tensors and every
// mismatch with the op it names refused; fast_p as KernelBench defines it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernelbench/kernelbench_op.h"

namespace kforge {
namespace {

nlohmann::json tensor(const std::string& name, std::vector<int64_t> shape, const std::string& dtype,
                      const std::string& role) {
  return {{"name", name}, {"shape", shape}, {"dtype", dtype}, {"role", role}};
}

// An RMSNorm problem: x[M, N] from get_inputs(), the Model's weight[N], the output y[M, N].
nlohmann::json rmsnorm_problem() {
  return {{"op", "rmsnorm"},
          {"dtype", "f32"},
          {"tensors",
           {tensor("x", {64, 256}, "f32", "input"), tensor("weight", {256}, "f32", "parameter"),
            tensor("out", {64, 256}, "f32", "output")}}};
}

std::string refusal(const nlohmann::json& described) {
  try {
    KernelBenchOp("kb:p", "p.py", described, nullptr);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(KernelBench, TakesItsSignatureAndSizesFromTheOpItNames) {
  const KernelBenchOp op("kb:02_rmsnorm", "02_rmsnorm.py", rmsnorm_problem(), nullptr);
  EXPECT_EQ(op.name(), "kb:02_rmsnorm");
  EXPECT_EQ(op.signature_op().name(), "rmsnorm");
  EXPECT_EQ(op.problem_sizes(), (Sizes{{"M", 64}, {"N", 256}}));
  EXPECT_EQ(op.format_shape(op.problem_sizes()), "64x256");
  EXPECT_EQ(op.dtypes(), std::vector<DType>{DType::f32});
  EXPECT_EQ(op.scalar_values(op.problem_sizes()), std::vector<double>{1e-6});
  // Every stage runs at the problem's one size.
  ASSERT_EQ(op.test_sizes().size(), 1u);
  EXPECT_EQ(op.test_sizes()[0].sizes, op.problem_sizes());
  EXPECT_TRUE(op.edge_sizes().empty());
  // Without its Python child it cannot draw the problem's inputs or run its Model.
  std::vector<std::vector<double>> out(1, std::vector<double>(64 * 256));
  EXPECT_THROW(op.reference(op.problem_sizes(), {}, {}, out), Error);
}

TEST(KernelBench, IntegerInputsAndScalarOutputsFollowTheOp) {
  const nlohmann::json described = {
      {"op", "cross_entropy"},
      {"dtype", "bf16"},
      {"tensors",
       {tensor("logits", {32, 1000}, "bf16", "input"), tensor("targets", {32}, "i64", "input"),
        tensor("out", {}, "bf16", "output")}}};
  const KernelBenchOp op("kb:ce", "ce.py", described, nullptr);
  EXPECT_EQ(op.format_shape(op.problem_sizes()), "32x1000");
  EXPECT_EQ(op.problem_dtype(), DType::bf16);
}

// The Model judges the problem's own inputs; kforge's adversarial ones go to the op's float64
// host reference, at the problem's size where that is affordable, else at the op's own.
TEST(KernelBench, AdversarialInputsAreJudgedByTheOpsHostReference) {
  const KernelBenchOp small("kb:02_rmsnorm", "02_rmsnorm.py", rmsnorm_problem(), nullptr);
  EXPECT_EQ(&small.reference_spec(InputKind::normal, small.problem_sizes()), &small);
  EXPECT_EQ(&small.reference_spec(InputKind::near_max, small.problem_sizes()),
            &small.signature_op());
  EXPECT_EQ(small.stability_size().sizes, small.problem_sizes());
  const std::vector<int64_t> qkv = {2, 16, 1024, 128};
  const nlohmann::json attention = {
      {"op", "flash_attention"},
      {"dtype", "bf16"},
      {"tensors",
       {tensor("q", qkv, "bf16", "input"), tensor("k", qkv, "bf16", "input"),
        tensor("v", qkv, "bf16", "input"), tensor("out", qkv, "bf16", "output")}}};
  const KernelBenchOp large("kb:attention", "attention.py", attention, nullptr);
  EXPECT_EQ(large.stability_size().sizes, large.signature_op().stability_size().sizes);
}

TEST(KernelBench, RefusesAProblemThatDoesNotFitItsOp) {
  nlohmann::json p = rmsnorm_problem();
  p["op"] = nullptr;
  EXPECT_NE(refusal(p).find("names no KFORGE_OP"), std::string::npos) << refusal(p);
  p["op"] = "rms_norm";
  EXPECT_NE(refusal(p).find("KFORGE_OP 'rms_norm' is not a kforge op"), std::string::npos);

  p = rmsnorm_problem();
  p["tensors"].erase(1);  // no weight parameter
  EXPECT_NE(refusal(p).find("rmsnorm takes x[M,N] weight[N] -> y[M,N]"), std::string::npos)
      << refusal(p);

  p = rmsnorm_problem();
  p["tensors"][1]["shape"] = {128};  // N disagrees between x and weight
  EXPECT_EQ(refusal(p), "p.py: N is 128 in weight but 256 in an earlier tensor");

  p = rmsnorm_problem();
  p["tensors"][2]["shape"] = {64, 128};  // the output is not y[M, N]
  EXPECT_NE(refusal(p).find("N is 128 in y but 256"), std::string::npos) << refusal(p);

  p = rmsnorm_problem();
  p["tensors"][1]["dtype"] = "f16";
  EXPECT_EQ(refusal(p), "p.py: tensor weight is f16 [256] but rmsnorm wants f32 [256] there");

  p = rmsnorm_problem();
  p["dtype"] = "f64";
  EXPECT_EQ(refusal(p), "p.py: rmsnorm does not take dtype f64");
}

TEST(KernelBench, ProblemsAreNamedAfterTheirFiles) {
  EXPECT_EQ(kernelbench_op_name("level1/07_swiglu_mlp.py"), "kb:07_swiglu_mlp");
  // Without a problem folder to look in, a kb: name is no op.
  unsetenv("KFORGE_KERNELBENCH_PROBLEMS");
  install_kernelbench_resolver();
  EXPECT_EQ(find_op("kb:07_swiglu_mlp"), nullptr);
}

TEST(KernelBench, FastPCountsOnlyCorrectKernelsFasterThanP) {
  const std::vector<ProblemScore> scores = {{"a", true, 2.5},
                                            {"b", true, 1.2},
                                            {"c", false, 9.0},  // fast but wrong: never counted
                                            {"d", true, 0.5}};
  EXPECT_DOUBLE_EQ(fast_p(scores, 0), 0.75);
  EXPECT_DOUBLE_EQ(fast_p(scores, 1), 0.5);
  EXPECT_DOUBLE_EQ(fast_p(scores, 1.5), 0.25);
  EXPECT_DOUBLE_EQ(fast_p(scores, 2), 0.25);
  EXPECT_DOUBLE_EQ(fast_p(scores, 3), 0);
  EXPECT_DOUBLE_EQ(fast_p({}, 1), 0);
}

}  // namespace
}  // namespace kforge
