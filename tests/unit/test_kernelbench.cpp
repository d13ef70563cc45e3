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

// A problem that names no op (a KernelBench file as published): the ops whose signature its
// tensors fit, told apart by whether its Model computes what each op's reference does (here a
// stand-in for running the Model); an op too costly to compare is taken only as the one fit.
TEST(KernelBench, IdentifiesTheOpOfAProblemThatNamesNone) {
  nlohmann::json p = rmsnorm_problem();
  p.erase("op");
  std::vector<std::string> asked;
  const auto agrees_with = [&](const std::string& computed) {
    return [&asked, computed](const OpSpec& op) -> std::optional<std::string> {
      asked.emplace_back(op.name());
      if (op.name() == computed) return std::nullopt;
      return "3 of 16384 elements differ";
    };
  };
  const IdentifiedOp rms = identify_signature_op("p.py", p, agrees_with("rmsnorm"));
  EXPECT_EQ(rms.op, "rmsnorm");
  EXPECT_NE(rms.how.find("its Model agreeing with rmsnorm's reference"), std::string::npos);
  EXPECT_EQ(asked, std::vector<std::string>{"rmsnorm"});  // the only op with this signature

  // x[M, N] -> out[M, N] is softmax's signature; a Model that is not a softmax is refused.
  nlohmann::json rows = {
      {"dtype", "f32"},
      {"tensors",
       {tensor("x", {64, 256}, "f32", "input"), tensor("out", {64, 256}, "f32", "output")}}};
  const auto refused = [&](const auto& judge) {
    try {
      identify_signature_op("relu.py", rows, judge);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string relu = refused(agrees_with("nothing"));
  EXPECT_NE(relu.find("computes none of the ops whose signature it has (not softmax: 3 of 16384"),
            std::string::npos)
      << relu;
  EXPECT_EQ(identify_signature_op("softmax.py", rows, agrees_with("softmax")).op, "softmax");

  // A large matmul: its host reference is not run; the signature is the only fit.
  asked.clear();
  const nlohmann::json mm = {
      {"dtype", "bf16"},
      {"tensors",
       {tensor("a", {4096, 4096}, "bf16", "input"), tensor("b", {4096, 4096}, "bf16", "input"),
        tensor("out", {4096, 4096}, "bf16", "output")}}};
  const IdentifiedOp matmul = identify_signature_op("mm.py", mm, agrees_with("nothing"));
  EXPECT_EQ(matmul.op, "matmul");
  EXPECT_NE(matmul.how.find("signature alone"), std::string::npos) << matmul.how;
  EXPECT_TRUE(asked.empty());

  // Tensors no op has.
  rows["tensors"].push_back(tensor("extra", {3}, "f32", "input"));
  EXPECT_NE(refused(agrees_with("softmax")).find("fit no kforge op's signature"),
            std::string::npos);
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
