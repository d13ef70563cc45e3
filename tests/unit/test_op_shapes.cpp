// Context texts -> kforge problems.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "profile/op_shapes.h"

namespace kforge {
namespace {

ContextOp text(const std::string& t) {
  return parse_context({t, {}, {}});
}

// Maps and returns the problem's shape as `kforge tune --shape` takes it ("" when unmapped).
std::string shape_of(const std::string& op, const ContextOp& context, ShapeHints hints = {},
                     std::vector<std::string>* notes = nullptr, std::string* why = nullptr) {
  const auto p = map_problem(op, context, hints, why);
  if (!p) return "";
  if (notes) *notes = p->notes;
  return find_op(op)->format_shape(p->sizes);
}

TEST(NvtxText, ParsesEmitNvtxRangesWithShapes) {
  // torch.autograd.profiler.emit_nvtx(record_shapes=True): getNvtxStr's format.
  const ContextOp op = text(
      "aten::addmm, seq = 12, op_id = 34, sizes = [[512], [8, 512], [512, 512], [], []], "
      "input_op_ids = [(0,-1), (30,0), (31,0), (0,-1), (0,-1)]");
  EXPECT_EQ(op.name, "aten::addmm");
  ASSERT_EQ(op.input_dims.size(), 5u);
  EXPECT_EQ(op.input_dims[0], (std::vector<int64_t>{512}));
  EXPECT_EQ(op.input_dims[1], (std::vector<int64_t>{8, 512}));
  EXPECT_TRUE(op.input_dims[3].empty());
  EXPECT_TRUE(op.identifies_call);
  EXPECT_EQ(op.fields.at("seq"), "12");
  EXPECT_FALSE(op.fields.contains("input_op_ids"));

  // Without record_shapes, and without autograd's seq.
  const ContextOp bare = text("aten::empty, op_id = 3");
  EXPECT_EQ(bare.name, "aten::empty");
  EXPECT_TRUE(bare.input_dims.empty());
  EXPECT_TRUE(bare.identifies_call);

  // The example models' module ranges: no call id.
  const ContextOp module = text("module::RMSNorm, sizes = [[2, 128, 512], [512]]");
  EXPECT_EQ(module.name, "module::RMSNorm");
  EXPECT_EQ(module.input_dims.size(), 2u);
  EXPECT_FALSE(module.identifies_call);

  // Free text stays a name; "key = value" items other than the known ones are kept.
  EXPECT_EQ(text("forward, step 3").name, "forward, step 3");
  EXPECT_EQ(text("module::Attention, causal = True").fields.at("causal"), "True");
  // A malformed size list is ignored, not fatal.
  EXPECT_TRUE(text("aten::mm, sizes = [[8, x]]").input_dims.empty());

  // Contexts that come with dims (torch trace import) keep them.
  const ContextOp traced = parse_context({"aten::mm", {{8, 16}, {16, 4}}, {"float", "float"}});
  EXPECT_EQ(traced.name, "aten::mm");
  EXPECT_EQ(traced.input_dims.size(), 2u);
  EXPECT_EQ(shape_of("matmul", traced), "8x4x16");

  // A trace's scalar arguments ("Concrete Inputs") name SDPA's causal flag by its position.
  const std::vector<std::vector<int64_t>> qkv = {
      {4, 16, 512, 64}, {4, 16, 512, 64}, {4, 16, 512, 64}, {}, {}, {}, {}, {}};
  const ContextOp sdpa = parse_context(
      {"aten::scaled_dot_product_attention", qkv, {}, {"", "", "", "", "0.", "True", "", "False"}});
  EXPECT_EQ(sdpa.fields.at("is_causal"), "True");
  EXPECT_EQ(shape_of("flash_attention", sdpa), "4x16x512x64,causal=1,scale_permille=0");
  // Other ops' values name nothing.
  EXPECT_TRUE(parse_context({"aten::mm", {{8, 16}, {16, 4}}, {}, {"", ""}}).fields.empty());
}

TEST(MapProblem, Matmuls) {
  EXPECT_EQ(shape_of("matmul", text("aten::mm, sizes = [[1024, 1000], [1000, 3000]]")),
            "1024x3000x1000");
  // addmm: the added input comes first (a bias here: matmul_bias, the same sizes).
  EXPECT_EQ(shape_of("matmul", text("aten::addmm, sizes = [[2304], [512, 768], [768, 2304], [], "
                                    "[]]")),
            "512x2304x768");
  // linear: x [.., K], weight [N, K]; M is the product of the leading dims.
  EXPECT_EQ(shape_of("matmul", text("aten::linear, sizes = [[2, 512, 1024], [3072, 1024], []]")),
            "1024x3072x1024");
  std::vector<std::string> notes;
  EXPECT_EQ(
      shape_of("matmul", text("aten::bmm, sizes = [[48, 128, 64], [48, 64, 128]]"), {}, &notes),
      "6144x128x64");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("batch 48 folded into M"), std::string::npos);
  EXPECT_EQ(shape_of("matmul", text("aten::matmul, sizes = [[4, 128, 768], [768, 50257]]")),
            "512x50257x768");
  EXPECT_EQ(shape_of("matmul", text("aten::matmul, sizes = [[4, 12, 128, 64], [4, 12, 64, "
                                    "128]]")),
            "6144x128x64");
  // Batch dims broadcast: [128, 64] @ [4, 12, 64, 128] is 48 products of 128 x 64 @ 64 x 128.
  EXPECT_EQ(shape_of("matmul", text("aten::matmul, sizes = [[128, 64], [4, 12, 64, 128]]")),
            "6144x128x64");
  EXPECT_EQ(shape_of("matmul", text("aten::matmul, sizes = [[1, 12, 128, 64], [4, 1, 64, 128]]")),
            "6144x128x64");
  std::string why;
  EXPECT_EQ(shape_of("matmul", text("aten::matmul, sizes = [[3, 128, 64], [4, 64, 128]]"), {},
                     nullptr, &why),
            "");
  EXPECT_NE(why.find("do not broadcast"), std::string::npos) << why;
  EXPECT_EQ(shape_of("matmul", text("aten::mm, sizes = [[8, 512], [256, 512]]"), {}, nullptr, &why),
            "");
  EXPECT_NE(why.find("not [M, K] and [K, N]"), std::string::npos) << why;
  EXPECT_EQ(shape_of("matmul", text("aten::mm"), {}, nullptr, &why), "");
  EXPECT_EQ(why, "no input shapes recorded");
}

TEST(MapProblem, RowOps) {
  EXPECT_EQ(shape_of("softmax", text("aten::_softmax, sizes = [[4, 12, 128, 128], [], []]")),
            "6144x128");
  EXPECT_EQ(shape_of("reduce", text("aten::sum, sizes = [[16384, 4096], [], [], []]")),
            "16384x4096");
  // Norms: over the weight's dims.
  EXPECT_EQ(shape_of("layernorm", text("aten::layer_norm, sizes = [[4, 128, 768], [], [768], "
                                       "[768], [], []]")),
            "512x768");
  EXPECT_EQ(shape_of("rmsnorm", text("aten::rms_norm, sizes = [[2, 512, 1024], [], [1024], []]")),
            "1024x1024");
  EXPECT_EQ(shape_of("rmsnorm", text("module::RMSNorm, sizes = [[2, 128, 512], [512]]")),
            "256x512");
  std::vector<std::string> notes;
  EXPECT_EQ(shape_of("rmsnorm", text("module::LlamaRMSNorm, sizes = [[2, 128, 512]]"), {}, &notes),
            "256x512");
  EXPECT_EQ(notes.size(), 1u);
  EXPECT_EQ(shape_of("rmsnorm", text("module::RMSNorm, sizes = [[2, 128, 512], [256]]")), "");
  EXPECT_EQ(shape_of("cross_entropy", text("aten::cross_entropy_loss, sizes = [[1024, 32000], "
                                           "[1024], [], [], [], []]")),
            "1024x32000");
  EXPECT_EQ(shape_of("cross_entropy", text("aten::cross_entropy_loss, sizes = [[8, 10, 32, 32], "
                                           "[8, 32, 32]]")),
            "");
}

TEST(MapProblem, Attention) {
  const std::string q = "[2, 8, 512, 128]";
  const ContextOp sdpa =
      text("aten::scaled_dot_product_attention, sizes = [" + q + ", " + q + ", " + q +
           ", [], [], "
           "[], [], []]");
  std::vector<std::string> notes;
  EXPECT_EQ(shape_of("flash_attention", sdpa, {}, &notes), "2x8x512x128,causal=0,scale_permille=0");
  EXPECT_EQ(notes, (std::vector<std::string>{"causal not recorded: assumed non-causal"}));
  EXPECT_EQ(shape_of("flash_attention", sdpa, {.causal = true}, &notes),
            "2x8x512x128,causal=1,scale_permille=0");
  EXPECT_TRUE(notes.empty());
  // The flash forward underneath takes [B, S, H, D].
  EXPECT_EQ(shape_of("flash_attention",
                     text("aten::_flash_attention_forward, sizes = [[2, 512, 8, 128], [2, 512, 8, "
                          "128], [2, 512, 8, 128], [], []]"),
                     {.causal = true}),
            "2x8x512x128,causal=1,scale_permille=0");
  // Grouped-query attention is costed at the query's heads; a decode step (1 query, many keys)
  // is no kforge problem.
  EXPECT_EQ(shape_of("flash_attention",
                     text("aten::scaled_dot_product_attention, sizes = [[1, 32, 256, 128], [1, 8, "
                          "256, 128], [1, 8, 256, 128]]"),
                     {.causal = false}, &notes),
            "1x32x256x128,causal=0,scale_permille=0");
  EXPECT_EQ(notes.size(), 1u);
  std::string why;
  EXPECT_EQ(shape_of("flash_attention",
                     text("aten::scaled_dot_product_attention, sizes = [[1, 32, 1, 128], [1, 32, "
                          "900, 128], [1, 32, 900, 128]]"),
                     {}, nullptr, &why),
            "");
  EXPECT_NE(why.find("query length 1 differs from key length 900"), std::string::npos) << why;
  // A causal flag recorded in the range text.
  EXPECT_EQ(shape_of("flash_attention", text("module::Attention, is_causal = True, sizes = [" + q +
                                             ", " + q + ", " + q + "]")),
            "2x8x512x128,causal=1,scale_permille=0");
}

TEST(MapProblem, RotaryAndMlpModules) {
  // The example models' convention: x [B, H, S, D], cos and sin [S, D/2].
  EXPECT_EQ(shape_of("rotary_embedding", text("module::RotaryEmbedding, sizes = [[2, 8, 512, 128], "
                                              "[512, 64], [512, 64]]")),
            "2x8x512x128");
  std::vector<std::string> notes;
  EXPECT_EQ(shape_of("rotary_embedding_half",
                     text("module::RotaryEmbeddingHalf, sizes = [[2, 512, 8, 128], [512, 64], "
                          "[512, 64]]"),
                     {}, &notes),
            "2x8x512x128");
  EXPECT_EQ(notes, (std::vector<std::string>{"x is [batch, seq_len, heads, head_dim]"}));
  const auto p = map_problem("rotary_embedding",
                             text("module::RotaryEmbedding, sizes = [[1, 32, 4096, 128], [4096, "
                                  "64], [4096, 64]]"),
                             {});
  ASSERT_TRUE(p);
  EXPECT_EQ(p->sizes.at("half_dim"), 64);  // completed by the op spec
  EXPECT_EQ(shape_of("rotary_embedding",
                     text("module::RotaryEmbedding, sizes = [[2, 8, 512, 128], [300, 64]]")),
            "");

  EXPECT_EQ(shape_of("fused_mlp", text("module::SwiGLU, sizes = [[2, 512, 1024], [2816, 1024], "
                                       "[2816, 1024], [1024, 2816]]")),
            "1024x1024x2816");
  std::string why;
  EXPECT_EQ(
      shape_of("fused_mlp", text("module::LlamaMLP, sizes = [[2, 512, 1024]]"), {}, nullptr, &why),
      "");
  EXPECT_NE(why.find("hidden size not recorded"), std::string::npos);
  EXPECT_EQ(shape_of("fused_mlp", text("module::SwiGLU, sizes = [[2, 512, 1024], [2816, 1024], "
                                       "[2816, 1024], [2816, 1024]]")),
            "");
}

// A matmul whose call adds a bias [N] is matmul_bias; a whole [M, N], matmul_residual; anything
// else added stays a matmul, noted.
TEST(MapProblem, MatmulsThatAddATermAreItsEpilogueOps) {
  const auto mapped = [](const std::string& t) {
    const auto p = map_problem("matmul", text(t), {});
    return p ? fmt::format("{} {}", p->op, find_op(p->op)->format_shape(p->sizes)) : "";
  };
  EXPECT_EQ(mapped("aten::addmm, sizes = [[2304], [512, 768], [768, 2304], [], []]"),
            "matmul_bias 512x2304x768");
  EXPECT_EQ(mapped("aten::addmm, sizes = [[1, 2304], [512, 768], [768, 2304], [], []]"),
            "matmul_bias 512x2304x768");
  EXPECT_EQ(mapped("aten::addmm, sizes = [[512, 2304], [512, 768], [768, 2304], [], []]"),
            "matmul_residual 512x2304x768");
  // Qwen2's q projection: linear with a bias; its o projection: none.
  EXPECT_EQ(mapped("aten::linear, sizes = [[4, 1024, 3584], [3584, 3584], [3584]]"),
            "matmul_bias 4096x3584x3584");
  EXPECT_EQ(mapped("aten::linear, sizes = [[4, 1024, 3584], [3584, 3584], []]"),
            "matmul 4096x3584x3584");
  const auto column = map_problem(
      "matmul", text("aten::addmm, sizes = [[512, 1], [512, 768], [768, 2304], [], []]"), {});
  ASSERT_TRUE(column);
  EXPECT_EQ(column->op, "matmul");
  ASSERT_EQ(column->notes.size(), 1u);
  EXPECT_NE(column->notes[0].find("[512, 1] is left out"), std::string::npos);
  // addmm with an activation after the bias: the matmul alone.
  const auto activated = map_problem(
      "matmul", text("aten::_addmm_activation, sizes = [[2304], [512, 768], [768, 2304], [], []]"),
      {});
  ASSERT_TRUE(activated);
  EXPECT_EQ(activated->op, "matmul");
}

TEST(MapProblem, DtypeFromInputTypes) {
  const auto p = map_problem("matmul",
                             parse_context({"aten::addmm",
                                            {{2304}, {512, 768}, {768, 2304}},
                                            {"c10::Half", "c10::Half", "c10::Half"}}),
                             {});
  ASSERT_TRUE(p);
  EXPECT_EQ(p->dtype, DType::f16);
  EXPECT_EQ(dtype_from_torch_type("c10::BFloat16"), DType::bf16);
  EXPECT_EQ(dtype_from_torch_type("float"), DType::f32);
  EXPECT_FALSE(dtype_from_torch_type("long int"));
  EXPECT_FALSE(map_problem("no_such_op", text("aten::mm, sizes = [[1, 2], [2, 3]]"), {}));
}

}  // namespace
}  // namespace kforge
