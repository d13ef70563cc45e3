// Composite ops and fusion groups (profile/fusion.h) on small profiles built here: each kernel
// with the module and op ranges `kforge profile --torch` records around it.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "plan_checks.h"
#include "profile/fusion.h"
#include "profile/planner.h"

namespace kforge {
namespace {

using test::expect_each_kernel_counted_once;
using test::row;

// Builds a profile kernel by kernel; every range gets its own call number, as the importers
// give them.
class ProfileBuilder {
 public:
  // Opens a module or op range that the following kernels run inside, until close().
  ProfileBuilder& open(const std::string& text) {
    stack_.push_back({.name = text, .call = ++calls_});
    return *this;
  }
  ProfileBuilder& close() {
    stack_.pop_back();
    return *this;
  }
  // One ATen op with one kernel of `us` microseconds.
  ProfileBuilder& op(const std::string& name, const std::string& sizes, int64_t us,
                     const std::string& kernel = "elementwise_kernel") {
    open(fmt::format("aten::{}, op_id = {}, sizes = {}", name, calls_ + 1, sizes));
    add_kernel(kernel, us);
    return close();
  }
  // An RMSNorm written out on x (dims text "[4, 256, 512]"), with `rows` its row dims and the
  // weight [D]; HF's float32 casts around it when `casts`.
  ProfileBuilder& rmsnorm_chain(const std::string& x, const std::string& rows,
                                const std::string& weight, bool casts) {
    if (casts) op("to", fmt::format("[{}, [], [], [], []]", x), 5);
    op("pow", fmt::format("[{}, []]", x), 5)
        .op("mean", fmt::format("[{}, [], [], []]", x), 5)
        .op("add", fmt::format("[{}, [], []]", rows), 1)
        .op("rsqrt", fmt::format("[{}]", rows), 1)
        .op("mul", fmt::format("[{}, {}]", x, rows), 5);
    if (casts) op("to", fmt::format("[{}, [], [], [], []]", x), 5);
    return op("mul", fmt::format("[{}, {}]", weight, x), 5);
  }
  ProfileBuilder& add_kernel(const std::string& name, int64_t us) {
    KernelRecord k;
    k.name = k.demangled = name;
    k.start_ns = now_;
    k.end_ns = now_ + us * 1000;
    now_ = k.end_ns + 500;
    k.context = stack_;
    profile_.kernels.push_back(std::move(k));
    return *this;
  }
  Profile build() {
    profile_.devices = {{0, "NVIDIA H100 80GB HBM3", 9, 0, 132}};
    return profile_;
  }

 private:
  Profile profile_;
  std::vector<OpContext> stack_;
  int64_t calls_ = 0;
  int64_t now_ = 0;
};

PlanOptions h100() {
  PlanOptions options;
  options.copy_gbps = 3000;
  options.matmul_tflops = 600;
  return options;
}

const char* kX = "[[2, 8, 128, 64], [1, 1, 128, 64]]";  // x [B, H, S, D], cos [1, 1, S, D]

TEST(Fusion, RotateHalfAndInterleavedRopeInAnAttentionForward) {
  ProfileBuilder b;
  b.open("module::MyAttention, name = attn, sizes = [[2, 128, 512]], types = [c10::BFloat16]");
  b.op("mul", kX, 10)
      .op("neg", "[[2, 8, 128, 32]]", 4)
      .op("cat", "[[2, 8, 128, 32], [2, 8, 128, 32], []]", 12);
  b.op("mul", kX, 10).op("add", "[[2, 8, 128, 64], [2, 8, 128, 64], []]", 10);
  b.op("mul", kX, 10)
      .op("neg", "[[2, 8, 128, 32]]", 4)
      .op("stack", "[[2, 8, 128, 32], [2, 8, 128, 32], []]", 12);
  b.op("mul", kX, 10).op("add", "[[2, 8, 128, 64], [2, 8, 128, 64], []]", 10);
  // A mul and add that form no pattern stay other.
  b.op("mul", kX, 10).op("add", "[[2, 8, 128, 64], [2, 8, 128, 64], []]", 10);
  const Profile profile = b.close().build();
  const Plan plan = make_plan(profile, h100());
  expect_each_kernel_counted_once(profile, plan);
  const PlanGroup& half = row(plan, "rotary_embedding_half", "2x8x128x64");
  EXPECT_EQ(half.calls, 1);
  EXPECT_EQ(half.kernels, 5);
  EXPECT_EQ(half.dtype_source, "enclosing range");  // the module's types
  EXPECT_EQ(half.rules.count("pattern-rope-rotate-half"), 1u);
  EXPECT_EQ(row(plan, "rotary_embedding", "2x8x128x64").kernels, 5);
  EXPECT_NEAR(plan.other_share, 20.0 / 112.0, 1e-9);
}

TEST(Fusion, RmsNormChainEagerAttentionAndLossOutsideModules) {
  ProfileBuilder b;
  b.open("module::Block, sizes = [[4, 256, 512]], types = [c10::BFloat16]");
  b.rmsnorm_chain("[4, 256, 512]", "[4, 256, 1]", "[512]", true);
  b.op("matmul", "[[4, 8, 256, 64], [4, 8, 64, 256]]", 20, "gemm_kernel")
      .op("div", "[[4, 8, 256, 256], []]", 8)
      .op("softmax", "[[4, 8, 256, 256], [], []]", 10, "softmax_warp_forward")
      .op("matmul", "[[4, 8, 256, 256], [4, 8, 256, 64]]", 20, "gemm_kernel");
  b.op("to", "[[4, 256, 1000], [], [], [], []]", 6)
      .op("log_softmax", "[[1024, 1000], [], []]", 8, "softmax_warp_forward")
      .op("nll_loss_nd", "[[1024, 1000], [1024], [], [], []]", 3, "nll_loss_forward_kernel");
  const Profile profile = b.close().build();
  const Plan plan = make_plan(profile, h100());
  expect_each_kernel_counted_once(profile, plan);
  EXPECT_EQ(row(plan, "rmsnorm", "1024x512").kernels, 8);
  const PlanGroup& attention = row(plan, "flash_attention", "4x8x256x64,causal=0,scale_permille=0");
  EXPECT_EQ(attention.kernels, 4);
  EXPECT_EQ(attention.calls, 1);
  // The chain's own leading cast is inside the pattern: 3 kernels, f32 nowhere.
  EXPECT_EQ(row(plan, "cross_entropy", "1024x1000").kernels, 3);
  EXPECT_EQ(plan.other_share, 0);
}

TEST(Fusion, ResidualAddJoinsTheNormThatReadsItAndACastJoinsItsConsumer) {
  ProfileBuilder b;
  const auto layer_norm = [&b] {
    b.open(
        "module::LayerNorm, sizes = [[4, 256, 512], [512], [512]], types = [c10::BFloat16, "
        "c10::BFloat16, c10::BFloat16]");
    b.op("layer_norm", "[[4, 256, 512], [], [512], [512], [], []]", 6,
         "vectorized_layer_norm_kernel");
    b.close();
  };
  b.open("module::Layer, sizes = [[4, 256, 512]], types = [c10::BFloat16]");
  b.op("add", "[[4, 256, 512], [4, 256, 512], []]", 7);
  layer_norm();
  // An add of another shape before a norm stays other.
  b.op("add", "[[4, 256, 1], [4, 256, 1], []]", 2);
  layer_norm();
  b.close();
  b.op("to", "[[4, 256, 32000], [], [], [], []]", 40, "unrolled_elementwise_kernel");
  b.op("fill_", "[[4, 257], []]", 1);  // the labels shifted in between
  b.op("cross_entropy_loss", "[[1024, 32000], [1024], [], [], [], []]", 50, "cunn_SoftMaxForward");
  const Profile profile = b.build();
  const Plan plan = make_plan(profile, h100());
  expect_each_kernel_counted_once(profile, plan);

  const PlanGroup* fused = nullptr;
  const PlanGroup* plain = nullptr;
  for (const auto& g : plan.groups) {
    if (g.op == "layernorm") (g.name == "residual_add+layernorm" ? fused : plain) = &g;
  }
  ASSERT_TRUE(fused && plain);
  EXPECT_EQ(fused->kernels, 2);
  EXPECT_EQ(plain->kernels, 1);
  // One more read (the residual) and one more write (the sum) than the norm alone.
  EXPECT_EQ(fused->cost()->bytes - plain->cost()->bytes, 2.0 * 4 * 256 * 512 * 2);

  const PlanGroup& loss = row(plan, "cross_entropy", "1024x32000");
  EXPECT_EQ(loss.name, "cast+cross_entropy");
  EXPECT_EQ(loss.kernels, 2);
  EXPECT_EQ(loss.dtype, DType::bf16);  // what the module around it computes in
}

TEST(Fusion, NothingRegroupedInsideAnEnclosingOpOrWithoutCallIdentities) {
  // An RMSNorm module owns its chain: no pattern takes it.
  ProfileBuilder b;
  b.open("module::RMSNorm, sizes = [[1024, 512], [512]]");
  b.rmsnorm_chain("[1024, 512]", "[1024, 1]", "[512]", false);
  Profile profile = b.close().build();
  Plan plan = make_plan(profile, h100());
  EXPECT_EQ(row(plan, "rmsnorm", "1024x512").rules.count("module-rmsnorm"), 1u);
  EXPECT_EQ(row(plan, "rmsnorm", "1024x512").kernels, 6);

  // The same RoPE chain from ranges without call numbers or op ids: left as it was.
  ProfileBuilder c;
  c.open("module::Attention").op("mul", kX, 10);
  Profile untracked = c.build();
  for (auto& k : untracked.kernels) {
    for (auto& entry : k.context) {
      entry.call = 0;
      entry.name = entry.name.substr(0, entry.name.find(", op_id"));
    }
  }
  plan = make_plan(untracked, h100());
  EXPECT_EQ(plan.other_share, 1.0);
}

TEST(Fusion, PatternsAreData) {
  ASSERT_FALSE(op_patterns().empty());
  for (const OpPattern& p : op_patterns()) {
    EXPECT_FALSE(p.steps.empty()) << p.id;
    EXPECT_EQ(p.op == "other", !p.group.empty()) << p.id;
  }
}

}  // namespace
}  // namespace kforge
