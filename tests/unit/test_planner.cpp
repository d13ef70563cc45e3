// The Amdahl planner on hand-made profiles (tests/data/profiles/README.md describes them), and
// `kforge plan` / `kforge tune --task` from the command line.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/process.h"
#include "plan_checks.h"
#include "profile/planner.h"
#include "test_support.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

Profile load(const std::string& name) {
  return read_profile(fs::path(test::test_data_dir()) / "profiles" / name);
}

PlanOptions h100() {  // tests/data/profiles/ceilings_h100.json
  PlanOptions o;
  o.copy_gbps = 3000;
  o.matmul_tflops = 600;
  return o;
}

using test::expect_each_kernel_counted_once;
using test::row;

// llama_block_nvtx.json: one bf16 Llama block forward and its loss on an H100, 404.6 us of
// kernels. Ceilings: copy 3000 GB/s, matmul 600 TFLOP/s. Per group (bytes and FLOPs from the op
// specs' cost models, best = max(bytes / 3e12, flops / 6e14, 1.5 us: the shortest kernel)):
//
//   cross_entropy 1024x32000: bytes 1024*32000*2 + 1024*8 = 65,544,192 -> best 21.848064 us;
//     85 us in 1 call (log_softmax 60 + nll_loss 25): s = 85 / 21.848064 = 3.890505;
//     f = 85 / 404.6 = 0.210084; gain = 1 / (0.789916 + 0.210084 / 3.890505) = 1.184953.
//   rmsnorm 1024x1024 (3 calls of 6 eager kernels, 16.6 us each): bytes (2*1024*1024 + 1024)*2 =
//     4,196,352 -> 1.398784 us, below the shortest kernel: best 1.5 us; s = 16.6 / 1.5 =
//     11.066667; f = 49.8 / 404.6 = 0.123085; gain 1.126078; cumulative with the row above:
//     1 / ((1 - 0.333169) + 0.053998 + 0.011122) = 1.366208.
//   fused_mlp 1024x1024x2816 (5 kernels, 58 us): FLOPs 6*1024*1024*2816 = 17,716,740,096 ->
//     29.527900 us (compute bound); s = 1.964244; gain 1.075698; cumulative 1.511529.
//   matmul 1024x32000x1024 (lm head, 140 us): FLOPs 2*1024*32000*1024 -> 111.848107 us;
//     s = 1.251698; gain 1.074783; cumulative 1.689183.
//   rotary_embedding 2x8x512x128 (2 back-to-back calls of 5 kernels, 21.8 us): bytes
//     (2*1,048,576 + 512*128)*2 = 4,325,376 -> 1.441792 us, below the floor: s = 10.9 / 1.5 =
//     7.266667; gain 1.048730; cumulative 1.833058.
//   flash_attention 2x8x512x128 causal (12 us): bytes 4*2*8*512*128*2 = 8,388,608 ->
//     2.796203 us; s = 4.291534; gain 1.023277; cumulative 1.912819.
//   matmul 1024x3072x1024 (14 us): 10.737418 us; s = 1.303852; gain 1.008129; cum 1.942785.
//   embedding (a named group, fusion.h), its index_select (4 us): a row read and written per
//     index, 2 x 2x512x1024 bf16 = 4.19 MB in 1.40 us, below the shortest kernel: 1.5 us;
//     s = 2.666667; gain 1.006217; cum 1.966391.
//   matmul 1024x1024x1024 (5.2 us): 3.579139 us; s = 1.452863; gain 1.004022; cum 1.982004.
// Then the groups without a roofline, by time: matmul ? (a GEMM with no context, 6 us), the
// residual adds (2 x 2.9 us; this profile's ranges do not identify calls, so they are not
// attached to the norms), a copy (3 us).
TEST(Planner, LlamaBlockFromNvtxRanges) {
  const Profile profile = load("llama_block_nvtx.json");
  const Plan plan = make_plan(profile, h100());
  EXPECT_EQ(plan.device, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(plan.kernel_time_ns, 404600);
  EXPECT_EQ(plan.transfer_time_ns, 2000);
  expect_each_kernel_counted_once(profile, plan);

  struct Expected {
    std::string op, shape;
    int64_t calls, kernels, time_ns;
    double share, s_max, gain, cumulative;
  };
  const std::vector<Expected> expected = {
      {"cross_entropy", "1024x32000", 1, 2, 85000, 0.210084034, 3.890504898, 1.184953270,
       1.184953270},
      {"rmsnorm", "1024x1024", 3, 18, 49800, 0.123084528, 11.066666667, 1.126078486, 1.366208492},
      {"fused_mlp", "1024x1024x2816", 1, 5, 58000, 0.143351458, 1.964243976, 1.075697920,
       1.511529066},
      {"matmul", "1024x32000x1024", 1, 1, 140000, 0.346020761, 1.251697540, 1.074782932,
       1.689183048},
      {"rotary_embedding", "2x8x512x128", 2, 10, 21800, 0.053880376, 7.266666667, 1.048729912,
       1.833057892},
      {"flash_attention", "2x8x512x128,causal=1,scale_permille=0", 1, 1, 12000, 0.029658922,
       4.291534424, 1.023277404, 1.912819009},
      {"matmul", "1024x3072x1024", 1, 1, 14000, 0.034602076, 1.303851604, 1.008129274, 1.942785386},
      {"matmul", "1024x1024x1024", 1, 1, 5200, 0.012852200, 1.452863216, 1.004022195, 1.982003922},
  };
  ASSERT_EQ(plan.groups.size(), expected.size() + 4);  // the embedding, 3 without a roofline
  const PlanGroup& embedding = plan.groups[7];
  EXPECT_EQ(embedding.name, "embedding");
  EXPECT_EQ(embedding.op, "other");
  EXPECT_EQ(embedding.shape, "2x512x1024");
  ASSERT_TRUE(embedding.gain && embedding.cumulative_gain);
  EXPECT_NEAR(*embedding.s_max, 4.0 / 1.5, 1e-9);
  EXPECT_NEAR(*embedding.gain, 1.006217359, 1e-9);
  EXPECT_NEAR(*embedding.cumulative_gain, 1.966390644, 1e-9);
  EXPECT_FALSE(embedding.extractable());
  for (size_t i = 0; i < expected.size(); ++i) {
    const Expected& e = expected[i];
    const size_t at = i < 7 ? i : i + 1;  // after the embedding
    const PlanGroup& g = plan.groups[at];
    SCOPED_TRACE(e.op + " " + e.shape);
    EXPECT_EQ(g.rank, static_cast<int>(at) + 1);
    EXPECT_EQ(g.op, e.op);
    EXPECT_EQ(g.shape, e.shape);
    EXPECT_EQ(g.dtype, DType::bf16);
    EXPECT_EQ(g.calls, e.calls);
    EXPECT_FALSE(g.calls_are_kernels);
    EXPECT_EQ(g.kernels, e.kernels);
    EXPECT_EQ(g.time_ns, e.time_ns);
    EXPECT_NEAR(g.share, e.share, 1e-9);
    ASSERT_TRUE(g.s_max && g.gain && g.cumulative_gain);
    EXPECT_NEAR(*g.s_max, e.s_max, 1e-6);
    EXPECT_NEAR(*g.gain, e.gain, 1e-9);
    EXPECT_NEAR(*g.cumulative_gain, e.cumulative, 1e-9);
    EXPECT_NEAR(g.gain_bound, 1 / (1 - e.share), 1e-9);
    EXPECT_TRUE(g.extractable());
  }
  EXPECT_NEAR(plan.all_fixed_gain, 1.982003922, 1e-9);

  // Bound and achieved throughput.
  const PlanGroup& ce = plan.groups[0];
  EXPECT_EQ(ce.bound, "memory");
  EXPECT_NEAR(*ce.best_ns_per_call, 21848.064, 1e-6);
  EXPECT_NEAR(*ce.achieved_gbps(), 65544192.0 / 85000, 1e-9);  // bytes per ns = GB/s
  EXPECT_EQ(plan.groups[2].bound, "compute");
  EXPECT_NEAR(*plan.groups[2].achieved_tflops(), 17716740096.0 / 58000 * 1e-3, 1e-9);

  // Evidence: where each dtype came from, what the rows were classified by.
  EXPECT_EQ(row(plan, "matmul", "1024x3072x1024").dtype_source, "default");  // nvjet names none
  EXPECT_EQ(row(plan, "matmul", "1024x32000x1024").dtype_source, "kernel name");
  EXPECT_EQ(row(plan, "rmsnorm", "1024x1024").rules.at("module-rmsnorm").kernels, 18);
  EXPECT_EQ(row(plan, "rmsnorm", "1024x1024").rules.at("module-rmsnorm").evidence, "module");
  EXPECT_EQ(row(plan, "cross_entropy", "1024x32000").rules.at("aten-cross-entropy").kernels, 2);
  EXPECT_EQ(row(plan, "flash_attention", "2x8x512x128,causal=1,scale_permille=0").notes.size(),
            0u);  // causal came from the kernel's template arguments
  EXPECT_EQ(row(plan, "rmsnorm", "1024x1024").kernel_names.size(), 5u);  // two muls share a name

  // The rows without a roofline follow, by time (after the embedding's row).
  const std::vector<std::pair<std::string, int64_t>> rest = {
      {"matmul", 6000}, {"other", 5800}, {"other", 3000}};
  const size_t first_rest = expected.size() + 1;
  for (size_t i = 0; i < rest.size(); ++i) {
    const PlanGroup& g = plan.groups[first_rest + i];
    EXPECT_EQ(g.op, rest[i].first);
    EXPECT_EQ(g.time_ns, rest[i].second);
    EXPECT_FALSE(g.gain);
    EXPECT_FALSE(g.cumulative_gain);
    EXPECT_TRUE(g.calls_are_kernels);
    EXPECT_FALSE(g.extractable());
  }
  const PlanGroup& unknown = plan.groups[first_rest];
  EXPECT_EQ(unknown.shape, "?");
  EXPECT_EQ(unknown.unmapped, (std::vector<std::string>{"the kernel name alone gives no shape"}));
  EXPECT_EQ(plan.groups[first_rest + 1].calls, 2);  // two residual adds, one kernel name
  EXPECT_EQ(plan.groups[first_rest + 1].shape, "-");
}

// --split-mlp: the MLP's three matmuls become matmul rows, its silu and mul other rows.
TEST(Planner, SplitMlpCountsTheMlpMatmulsApart) {
  const Profile profile = load("llama_block_nvtx.json");
  PlanOptions options = h100();
  options.classify.split_mlp = true;
  const Plan plan = make_plan(profile, options);
  expect_each_kernel_counted_once(profile, plan);
  for (const auto& g : plan.groups)
    EXPECT_NE(g.op, "fused_mlp");
  const PlanGroup& gate_up = row(plan, "matmul", "1024x2816x1024");
  EXPECT_EQ(gate_up.calls, 2);  // two aten::mm calls (their op_ids differ)
  EXPECT_EQ(gate_up.time_ns, 32000);
  EXPECT_EQ(row(plan, "matmul", "1024x1024x2816").time_ns, 17000);
  int64_t other_mlp = 0;
  for (const auto& g : plan.groups) {
    if (g.rules.contains("mlp-split")) other_mlp += g.time_ns;
  }
  EXPECT_EQ(other_mlp, 4600 + 4400);
}

// gpt2_torch_trace.json: an f16 GPT-2 fragment on an A100 from a torch.profiler trace: contexts
// carry dims and dtypes, no call ids. Ceilings: copy 1700 GB/s, matmul 280 TFLOP/s.
//   softmax 512x50257: two identical calls back to back (told apart by repetition), 300 us;
//     bytes 2*512*50257*2 = 102,926,336 -> 60.544904 us; s = 150 / 60.544904 = 2.477497.
//   flash_attention 4x12x128x64 through SDPA's math path (bmm, softmax, bmm: 30 us, one call):
//     bytes 4*4*12*128*64*2 = 3,145,728 -> 1.850428 us, below the shortest kernel of the
//     profile (6 us), which bounds it: s = 30 / 6 = 5; causal not recorded: non-causal.
//   matmul 512x768x2304: the backward aten::mm inside AddmmBackward0 is a matmul.
//   The layer norm's backward kernels are other.
TEST(Planner, TorchTraceContextsWithDimsAndTypes) {
  const Profile profile = load("gpt2_torch_trace.json");
  PlanOptions options;
  options.copy_gbps = 1700;
  options.matmul_tflops = 280;
  const Plan plan = make_plan(profile, options);
  expect_each_kernel_counted_once(profile, plan);
  EXPECT_EQ(plan.groups.size(), 7u);

  const PlanGroup& softmax = row(plan, "softmax", "512x50257");
  EXPECT_EQ(softmax.calls, 2);
  EXPECT_EQ(softmax.dtype, DType::f16);
  EXPECT_EQ(softmax.dtype_source, "input types");
  EXPECT_NEAR(*softmax.best_ns_per_call, 102926336.0 / 1700, 1e-6);  // bytes / (GB/s) = ns
  EXPECT_NEAR(*softmax.s_max, 150000 / (102926336.0 / 1700), 1e-9);
  EXPECT_NEAR(softmax.share, 300.0 / 424, 1e-12);
  EXPECT_EQ(plan.groups[0].op, "softmax");  // the largest gain

  const PlanGroup& attention =
      row(plan, "flash_attention", "4x12x128x64,causal=0,scale_permille=0");
  EXPECT_EQ(attention.calls, 1);
  EXPECT_EQ(attention.kernels, 3);
  EXPECT_EQ(attention.time_ns, 30000);
  EXPECT_EQ(attention.bound, "latency");
  EXPECT_NEAR(*attention.best_ns_per_call, 6000, 1e-9);
  EXPECT_NEAR(*attention.s_max, 5, 1e-9);
  EXPECT_EQ(attention.notes,
            (std::vector<std::string>{"causal not recorded: assumed non-causal",
                                      "roofline 1.85 us is below the shortest kernel of the "
                                      "profile (6.00 us): bounded by that"}));

  EXPECT_EQ(row(plan, "matmul_bias", "512x2304x768").time_ns, 30000);
  EXPECT_EQ(row(plan, "matmul", "512x768x2304").time_ns, 31000);
  EXPECT_EQ(row(plan, "layernorm", "512x768").dtype, DType::f16);
  int64_t backward = 0;
  for (const auto& g : plan.groups) {
    if (g.rules.contains("backward")) {
      EXPECT_EQ(g.op, "other");
      backward += g.time_ns;
    }
  }
  EXPECT_EQ(backward, 24000);
}

// llama_block_compiled.json: a torch.compile run without NVTX: names only, so every row of a
// kforge op has an unknown shape; rows rank by time and no gain is claimed.
TEST(Planner, NamesOnlyGiveOpsWithoutShapes) {
  const Profile profile = load("llama_block_compiled.json");
  const Plan plan = make_plan(profile, h100());
  expect_each_kernel_counted_once(profile, plan);
  std::map<std::string, int64_t> time_by_op;
  for (size_t i = 0; i < plan.groups.size(); ++i) {
    const PlanGroup& g = plan.groups[i];
    EXPECT_FALSE(g.gain);
    EXPECT_FALSE(g.extractable());
    if (i > 0) EXPECT_GE(plan.groups[i - 1].time_ns, g.time_ns);
    time_by_op[g.op] += g.time_ns;
  }
  EXPECT_EQ(plan.all_fixed_gain, 1.0);
  EXPECT_EQ(time_by_op.at("matmul"), 14000 + 6000 + 32000 + 17000);
  EXPECT_EQ(time_by_op.at("rmsnorm"), 16000);
  EXPECT_EQ(time_by_op.at("cross_entropy"), 44000);
  EXPECT_EQ(time_by_op.at("fused_mlp"), 5000);
  EXPECT_EQ(time_by_op.at("flash_attention"), 12000);
  EXPECT_EQ(time_by_op.at("other"), 3000);
  EXPECT_EQ(row(plan, "rmsnorm", "?").calls, 2);
  EXPECT_TRUE(row(plan, "rmsnorm", "?").calls_are_kernels);
}

// A kernel faster than the DRAM roofline (its inputs sat in L2) gains nothing.
TEST(Planner, FasterThanTheRooflineGainsNothing) {
  Profile profile;
  profile.devices = {{0, "NVIDIA H100 80GB HBM3", 9, 0, 132}};
  KernelRecord k;
  k.name = k.demangled =
      "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
      "at::native::MeanOps<float, float>, unsigned int, float, 4> >()";
  k.start_ns = 0;
  k.end_ns = 1000;  // reduce 4096x4096 f32 reads 67 MB: 22.4 us at 3000 GB/s
  k.context = {{"aten::sum, seq = 1, op_id = 2, sizes = [[4096, 4096], [], [], []]", {}, {}}};
  profile.kernels = {k};
  KernelRecord add = k;
  add.name = add.demangled = "void at::native::vectorized_elementwise_kernel<4>()";
  add.context = {};
  add.start_ns = 2000;
  add.end_ns = 3000;
  profile.kernels.push_back(add);
  const Plan plan = make_plan(profile, h100());
  const PlanGroup& reduce = row(plan, "reduce", "4096x4096");
  EXPECT_EQ(reduce.dtype, DType::f32);  // the kernel name's
  EXPECT_LT(*reduce.s_max, 1);
  EXPECT_EQ(*reduce.gain, 1.0);
  EXPECT_EQ(*reduce.cumulative_gain, 1.0);
  EXPECT_NE(std::find(reduce.notes.begin(), reduce.notes.end(),
                      "faster than the DRAM roofline (inputs likely held in L2): no gain"),
            reduce.notes.end());
  EXPECT_THROW(make_plan(Profile{}, h100()), UsageError);
  EXPECT_THROW(make_plan(profile, PlanOptions{}), Error);  // no ceilings
}

// A kernel of `ns` nanoseconds from `start`, launched under `context` (outermost first).
KernelRecord kernel_at(const std::string& name, int64_t start, int64_t ns,
                       std::vector<OpContext> context) {
  KernelRecord k;
  k.name = k.demangled = name;
  k.start_ns = start;
  k.end_ns = start + ns;
  k.context = std::move(context);
  return k;
}

const std::vector<std::string> kBf16 = {"c10::BFloat16", "c10::BFloat16"};

// Ceilings copy 3000 GB/s, matmul 600 TFLOP/s. A bf16 4096^3 GEMM in 190 us runs at
// 2 * 4096^3 / 190e-6 = 723.4 TFLOP/s: the ceiling becomes that. Faster f32 GEMMs and an
// attention whose causal flag is unknown (so its FLOPs are a guess) do not raise it.
TEST(Planner, TheFastestGemmRaisesTheMatmulCeiling) {
  Profile profile;
  profile.devices = {{0, "NVIDIA H100 80GB HBM3", 9, 0, 132}};
  const std::string gemm = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT";
  profile.kernels = {
      kernel_at(gemm, 0, 190000, {{"aten::mm", {{4096, 4096}, {4096, 4096}}, kBf16}}),
      kernel_at(gemm, 200000, 60000, {{"aten::mm", {{2048, 2048}, {2048, 2048}}, kBf16}}),
      kernel_at("ampere_sgemm_128x64_tn", 300000, 100000,
                {{"aten::mm", {{4096, 4096}, {4096, 4096}}, {"float", "float"}}}),
      kernel_at("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", 500000,
                1000000,
                {{"aten::scaled_dot_product_attention",
                  {{8, 16, 4096, 128}, {8, 16, 4096, 128}, {8, 16, 4096, 128}},
                  {"c10::BFloat16", "c10::BFloat16", "c10::BFloat16"}}}),
      kernel_at("void at::native::vectorized_elementwise_kernel<4>()", 1600000, 0, {}),
      kernel_at("void at::native::vectorized_elementwise_kernel<4>()", 1700000, 2500, {})};
  const Plan plan = make_plan(profile, h100());
  const double fast_tflops = 2.0 * 4096 * 4096 * 4096 / 190000 * 1e-3;
  ASSERT_TRUE(plan.raised_matmul_tflops);
  EXPECT_DOUBLE_EQ(*plan.raised_matmul_tflops, fast_tflops);
  EXPECT_EQ(plan.raised_by, "matmul 4096x4096x4096 bf16");

  const PlanGroup& fast = row(plan, "matmul", "4096x4096x4096");
  EXPECT_EQ(*fast.s_max, 1.0);
  ASSERT_FALSE(fast.notes.empty());
  EXPECT_NE(fast.notes.back().find("sets the matmul ceiling"), std::string::npos);
  const PlanGroup& slow = row(plan, "matmul", "2048x2048x2048");
  EXPECT_NEAR(*slow.s_max, 60000 / (2.0 * 2048 * 2048 * 2048 / fast_tflops * 1e-3), 1e-9);
  // The f32 GEMM (1374 TFLOP/s on paper) is above the ceiling and says so.
  for (const auto& g : plan.groups) {
    if (g.op == "matmul" && g.dtype == DType::f32) EXPECT_LT(*g.s_max, 1.0);
  }
  // Non-causal as assumed: 4 * 8 * 16 * 4096^2 * 128 FLOPs in 1 ms = 1100 TFLOP/s, no raise.
  const PlanGroup& attention =
      row(plan, "flash_attention", "8x16x4096x128,causal=0,scale_permille=0");
  EXPECT_EQ(attention.dtype, DType::bf16);
  // The zero-length kernel is no floor; the 2.5 us one is the shortest.
  EXPECT_EQ(plan.shortest_kernel_ns, 2500);
}

// NVTX ranges record no dtypes and nvjet names none: a GEMM takes the dtype of the kernels in
// the range around it, 16-bit first even where float kernels took more time (autocast).
TEST(Planner, DtypeFromTheRangeAroundTheCall) {
  Profile profile;
  profile.devices = {{0, "NVIDIA H100 80GB HBM3", 9, 0, 132}};
  const OpContext block{"module::Block", {}, {}};
  profile.kernels = {
      kernel_at("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
                "at::native::MeanOps<float, float>, unsigned int, float, 4> >()",
                0, 50000, {block, {"aten::mean, op_id = 2, sizes = [[512, 1024]]", {}, {}}}),
      kernel_at("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<"
                "c10::BFloat16, c10::BFloat16, c10::BFloat16> >()",
                60000, 1000, {block, {"aten::add, op_id = 3, sizes = [[512, 1024]]", {}, {}}}),
      kernel_at("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT", 70000, 10000,
                {block, {"aten::mm, op_id = 4, sizes = [[512, 1024], [1024, 1024]]", {}, {}}}),
      kernel_at("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT", 90000, 10000,
                {{"aten::mm, op_id = 5, sizes = [[512, 1024], [1024, 2048]]", {}, {}}})};
  PlanOptions options = h100();
  options.default_dtype = DType::f16;
  const Plan plan = make_plan(profile, options);
  const PlanGroup& inside = row(plan, "matmul", "512x1024x1024");
  EXPECT_EQ(inside.dtype, DType::bf16);
  EXPECT_EQ(inside.dtype_source, "enclosing range");
  EXPECT_EQ(inside.notes,
            (std::vector<std::string>{"dtype from the other kernels in range module::Block"}));
  const PlanGroup& outside = row(plan, "matmul", "512x2048x1024");  // no range around it
  EXPECT_EQ(outside.dtype, DType::f16);
  EXPECT_EQ(outside.dtype_source, "default");
}

TEST(Planner, JsonAndTaskFiles) {
  const Profile profile = load("llama_block_nvtx.json");
  const Plan plan = make_plan(profile, h100());
  const json j = plan_to_json(plan);
  EXPECT_EQ(j.at("kernel_time_ns"), 404600);
  EXPECT_EQ(j.at("groups").size(), plan.groups.size());
  const json& first = j.at("groups")[0];
  EXPECT_EQ(first.at("op"), "cross_entropy");
  EXPECT_EQ(first.at("sizes").at("vocab"), 32000);
  EXPECT_NEAR(first.at("us_per_call").get<double>(), 85.0, 1e-9);
  EXPECT_NEAR(first.at("best_us_per_call").get<double>(), 21.848064, 1e-9);
  EXPECT_TRUE(j.at("groups").back().at("gain").is_null());
  EXPECT_EQ(first.at("rules").at("aten-cross-entropy").at("evidence"), "context op");

  const auto dir = test::temp_dir("task-file");
  const json task = task_to_json(plan, plan.groups[5], "profile.json");
  EXPECT_EQ(task.at("op"), "flash_attention");
  EXPECT_EQ(task.at("shape"), "2x8x512x128,causal=1,scale_permille=0");
  EXPECT_EQ(task.at("dtype"), "bf16");
  EXPECT_NEAR(task.at("baseline_us").get<double>(), 12.0, 1e-9);
  EXPECT_TRUE(fs::path(task.at("profile").get<std::string>()).is_absolute());
  std::ofstream(dir / "task.json") << task.dump(2);
  const PlanTask back = read_task_file(dir / "task.json");
  EXPECT_EQ(back.op, "flash_attention");
  EXPECT_EQ(back.shape, "2x8x512x128,causal=1,scale_permille=0");
  EXPECT_EQ(back.dtype, "bf16");
  // The shape is what `kforge tune --shape` parses.
  EXPECT_EQ(find_op(back.op)->parse_shape(back.shape).at("causal"), 1);
  std::ofstream(dir / "bad.json") << R"({"op": "rmsnorm", "dtype": "bf16"})";
  EXPECT_THROW(read_task_file(dir / "bad.json"), UsageError);
}

// ----------------------------------------------------------------------------- command line

CommandResult kforge(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {test::kforge_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, std::chrono::minutes(5));
}

std::string data(const std::string& name) {
  return (fs::path(test::test_data_dir()) / "profiles" / name).string();
}

TEST(PlanCli, TableJsonAndExtractedTasks) {
  const auto dir = test::temp_dir("plan-cli");
  const CommandResult r =
      kforge({"plan", data("llama_block_nvtx.json"), "--ceilings", data("ceilings_h100.json"),
              "--json", (dir / "plan.json").string(), "--extract", "3", "--workspace",
              (dir / "ws").string(), "--top", "10"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("44 kernels, 0.405 ms of kernel time"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("copy 3000 GB/s, matmul 600 TFLOP/s"), std::string::npos);
  EXPECT_NE(r.output.find("cross_entropy"), std::string::npos);
  EXPECT_NE(r.output.find("1.185"), std::string::npos);  // its gain
  EXPECT_NE(r.output.find("1.982x"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("... 2 more groups"), std::string::npos) << r.output;

  const json plan = json::parse(std::ifstream(dir / "plan.json"));
  EXPECT_EQ(plan.at("groups").size(), 12u);
  EXPECT_EQ(plan.at("ceilings").at("copy_gbps"), 3000.0);
  EXPECT_TRUE(plan.contains("run"));

  const json workspace_plan = json::parse(std::ifstream(dir / "ws" / "plan.json"));
  const json& tasks = workspace_plan.at("tasks");
  ASSERT_EQ(tasks.size(), 3u);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"cross_entropy", "1024x32000"}, {"rmsnorm", "1024x1024"}, {"fused_mlp", "1024x1024x2816"}};
  for (size_t i = 0; i < 3; ++i) {
    const fs::path path = tasks[i].get<std::string>();
    EXPECT_EQ(path.parent_path().parent_path(), dir / "ws");
    const json task = json::parse(std::ifstream(path));
    EXPECT_EQ(task.at("op"), expected[i].first);
    EXPECT_EQ(task.at("shape"), expected[i].second);
    EXPECT_EQ(task.at("dtype"), "bf16");
    EXPECT_EQ(task.at("rank"), static_cast<int>(i) + 1);
    EXPECT_FALSE(task.at("kernel_names").empty());
  }
  EXPECT_EQ(fs::path(tasks[0].get<std::string>()).parent_path().filename(),
            "01-cross_entropy-1024x32000-bf16");
}

TEST(PlanCli, CeilingsFromTheCacheByDeviceName) {
  const auto dir = test::temp_dir("plan-cache");
  // Without cached ceilings for the profile's GPU: a usage error that says what to do.
  ::setenv("KFORGE_CACHE_DIR", (dir / "cache").c_str(), 1);
  CommandResult r = kforge({"plan", data("gpt2_torch_trace.json")});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("no measured ceilings for NVIDIA A100-SXM4-80GB"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("kforge ceilings"), std::string::npos);

  // `kforge ceilings` caches one file per device; plan finds it by the device's name.
  fs::create_directories(dir / "cache" / "ceilings");
  fs::copy_file(data("ceilings_h100.json"), dir / "cache" / "ceilings" / "cuda-h100.json");
  fs::copy_file(data("ceilings_a100.json"), dir / "cache" / "ceilings" / "cuda-a100.json");
  r = kforge({"plan", data("gpt2_torch_trace.json"), "--json", (dir / "plan.json").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("copy 1700 GB/s, matmul 280 TFLOP/s (cache"), std::string::npos)
      << r.output;
  const json plan = json::parse(std::ifstream(dir / "plan.json"));
  EXPECT_EQ(plan.at("device"), "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(plan.at("groups")[0].at("op"), "softmax");
  ::unsetenv("KFORGE_CACHE_DIR");

  // Bad input: usage errors (exit 2).
  EXPECT_EQ(kforge({"plan", (dir / "missing.json").string()}).exit_code, 2);
  EXPECT_EQ(
      kforge({"plan", data("llama_block_nvtx.json"), "--ceilings", data("llama_block_nvtx.json")})
          .exit_code,
      2);
  r = kforge({"plan", data("llama_block_nvtx.json"), "--ceilings", data("ceilings_h100.json"),
              "--extract", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--workspace"), std::string::npos) << r.output;
}

// plan --extract, then `kforge tune --task` on the CPU backend takes the task's problem.
TEST(PlanCli, ExtractedTaskIsAcceptedByTune) {
  const auto dir = test::temp_dir("plan-tune");
  ::setenv("KFORGE_CACHE_DIR", (dir / "cache").c_str(), 1);
  CommandResult r =
      kforge({"plan", data("tiny_rmsnorm_f32.json"), "--ceilings", data("ceilings_h100.json"),
              "--extract", "1", "--workspace", (dir / "ws").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path task = dir / "ws" / "01-rmsnorm-64x128-f32" / "task.json";
  ASSERT_TRUE(fs::exists(task)) << r.output;

  r = kforge({"tune", "--task", task.string(), "--backend", "cpu", "--budget", "2",
              "--no-final-check", "--db", (dir / "results.sqlite").string(), "--json",
              (dir / "tune.json").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(std::ifstream(dir / "tune.json")).at("problem"), "rmsnorm 64x128 f32");

  // What the command line adds must agree with the task.
  r = kforge({"tune", "softmax", "--task", task.string(), "--backend", "cpu"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("the task"), std::string::npos) << r.output;
  r = kforge({"tune", "--task", task.string(), "--dtype", "bf16", "--backend", "cpu"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("differs from the task's dtype f32"), std::string::npos) << r.output;
  EXPECT_EQ(kforge({"tune", "--backend", "cpu"}).exit_code, 2);
  ::unsetenv("KFORGE_CACHE_DIR");
}

// tune --start names its file as the tuned file was given (a path) or by its name; an unknown
// file or tunable is a usage error before anything runs.
TEST(TuneCli, StartsNameTheirFileByPathOrName) {
  const auto dir = test::temp_dir("tune-start");
  ::setenv("KFORGE_CACHE_DIR", test::shared_module_cache().c_str(), 1);
  const std::string file = test::kernels_dir() + "/rmsnorm/rmsnorm_cpu.cpp";
  const auto tune = [&](const std::string& start) {
    return kforge({"tune", file, "--shape", "64x64", "--backend", "cpu", "--strategy", "local",
                   "--budget", "2", "--no-final-check", "--db", (dir / "results.sqlite").string(),
                   "--start", start});
  };
  for (const std::string& start : {file + ":UNROLL=2", std::string("rmsnorm_cpu.cpp:UNROLL=2")}) {
    const CommandResult r = tune(start);
    EXPECT_EQ(r.exit_code, 0) << start << "\n" << r.output;
    EXPECT_NE(r.output.find("UNROLL=2"), std::string::npos) << r.output;
  }
  CommandResult r = tune("softmax_cpu.cpp:UNROLL=2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("one of the tuned files"), std::string::npos) << r.output;
  r = tune(file + ":UNROLLS=2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("has no tunable UNROLLS"), std::string::npos) << r.output;
  ::unsetenv("KFORGE_CACHE_DIR");
}

}  // namespace
}  // namespace kforge
