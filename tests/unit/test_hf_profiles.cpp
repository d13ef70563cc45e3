// Hugging Face models as users run them, recorded on an H100 with `kforge profile --torch`
// (tests/data/recorded_hf/README.md says how): unannotated, one `step` range per iteration, two
// layers, one timed step.
//
// What is expected comes from the models' configs and code (python/examples/hf_model.py), not
// from kforge: per decoder layer the q/k/v/o projections, RoPE on q and k, one attention, one
// MLP, two norms each read right after a residual add (except the first layer's first one), two
// cache appends (keys, values); then the final norm, the LM head, and the loss on logits cast
// to float.
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "device/ceilings.h"
#include "plan_checks.h"
#include "profile/cupti_import.h"
#include "profile/planner.h"
#include "test_support.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using test::expect_each_kernel_counted_once;

// (name, shape, dtype, calls) of every named row: kforge ops, fusion groups, named groups.
using Row = std::tuple<std::string, std::string, std::string, int64_t>;

fs::path recorded(const std::string& name) {
  return fs::path(test::test_data_dir()) / "recorded_hf" / name;
}

// `kforge profile --torch --range step --skip 1 -- python3 hf_model.py MODEL --layers 2
// --steps 2`: the second step.
Profile timed_step(const std::string& model) {
  AssembleOptions options;
  options.range = "step";
  options.skip = 1;
  return assemble_profile(read_raw_files(recorded(model)), options);
}

Plan plan_of(const Profile& profile) {
  const Ceilings c = read_ceilings_file(recorded("ceilings_h100.json"));
  PlanOptions options;
  options.copy_gbps = c.copy_gbps;
  options.matmul_tflops = c.matmul_tflops;
  return make_plan(profile, options);
}

std::vector<Row> named_rows(const Plan& plan) {
  std::vector<Row> rows;
  for (const auto& g : plan.groups) {
    if (g.name != "other")
      rows.emplace_back(g.name, g.shape, g.dtype ? dtype_name(*g.dtype) : "-", g.calls);
  }
  std::sort(rows.begin(), rows.end());
  return rows;
}

std::vector<Row> sorted(std::vector<Row> rows) {
  std::sort(rows.begin(), rows.end());
  return rows;
}

// The bar: at least 90% of kernel time in kforge ops or named groups, other under 10%.
void expect_attributed(const Profile& profile, const Plan& plan) {
  expect_each_kernel_counted_once(profile, plan);
  EXPECT_GE(plan.op_share + plan.named_share, 0.90);
  EXPECT_LT(plan.other_share, 0.10);
  EXPECT_NEAR(plan.op_share + plan.named_share + plan.other_share, 1.0, 1e-9);
}

// Decoder-only models: tokens = 4 x 1024, two layers; hidden D, heads H of 128, KV heads KV;
// with `qkv_bias`, the q, k and v projections add a bias (matmul_bias) and o does not.
std::vector<Row> decoder_rows(int64_t d, int64_t heads, int64_t kv_heads, int64_t mlp,
                              int64_t vocab, bool qkv_bias = false) {
  const int64_t layers = 2, tokens = 4096;
  const std::string t = std::to_string(tokens), dim = std::to_string(d);
  const auto bhsd = [](int64_t h) { return "4x" + std::to_string(h) + "x1024x128"; };
  std::vector<Row> rows = {
      {"embedding", "4x1024x" + dim, "bf16", 1},
      {"rope_tables", "?", "bf16", 1},
      {"rmsnorm", t + "x" + dim, "bf16", 1},
      {"residual_add+rmsnorm", t + "x" + dim, "bf16", 2 * layers},
      {"flash_attention", bhsd(heads) + ",causal=1,scale_permille=0", "bf16", layers},
      {"fused_mlp", t + "x" + dim + "x" + std::to_string(mlp), "bf16", layers},
      {"kv_cache", bhsd(kv_heads), "bf16", 2 * layers},
      {"matmul", t + "x" + std::to_string(vocab) + "x" + dim, "bf16", 1},
      {"cast+cross_entropy", t + "x" + std::to_string(vocab), "bf16", 1},
  };
  const std::string q = t + "x" + dim + "x" + dim;
  const std::string kv = t + "x" + std::to_string(kv_heads * 128) + "x" + dim;
  if (kv_heads == heads) {
    rows.emplace_back("matmul", q, "bf16", 4 * layers);
    rows.emplace_back("rotary_embedding_half", bhsd(heads), "bf16", 2 * layers);
  } else {
    if (qkv_bias) {
      rows.emplace_back("matmul_bias", q, "bf16", layers);       // q
      rows.emplace_back("matmul", q, "bf16", layers);            // o
      rows.emplace_back("matmul_bias", kv, "bf16", 2 * layers);  // k, v
    } else {
      rows.emplace_back("matmul", q, "bf16", 2 * layers);   // q, o
      rows.emplace_back("matmul", kv, "bf16", 2 * layers);  // k, v
    }
    rows.emplace_back("rotary_embedding_half", bhsd(heads), "bf16", layers);
    rows.emplace_back("rotary_embedding_half", bhsd(kv_heads), "bf16", layers);
  }
  return sorted(rows);
}

TEST(HfProfiles, LlamaEveryOpFoundWithoutAnnotations) {
  // hidden 2048, 16 heads (16 KV), intermediate 5632, vocab 32000.
  const Profile profile = timed_step("llama");
  const Plan plan = plan_of(profile);
  expect_attributed(profile, plan);
  EXPECT_EQ(named_rows(plan), decoder_rows(2048, 16, 16, 5632, 32000));
  // The loss's float cast is costed in the model's dtype, with the cast inside the group.
  const PlanGroup& loss = test::row(plan, "cross_entropy", "4096x32000");
  EXPECT_EQ(loss.name, "cast+cross_entropy");
  EXPECT_EQ(loss.dtype_source, "enclosing range");
  EXPECT_EQ(loss.kernels, 3);  // cast, log_softmax, nll_loss
}

TEST(HfProfiles, Qwen2GroupedQueryHeadsAndBiases) {
  // hidden 1536, 12 heads / 2 KV heads, intermediate 8960, vocab 32000; q/k/v with biases.
  const Profile profile = timed_step("qwen2");
  const Plan plan = plan_of(profile);
  expect_attributed(profile, plan);
  EXPECT_EQ(named_rows(plan), decoder_rows(1536, 12, 2, 8960, 32000, true));
}

TEST(HfProfiles, MistralSwigluFoundByStructure) {
  // hidden 2048, 16 heads / 8 KV heads, intermediate 5632, vocab 32000. MistralMLP matches no
  // class name rule: its gate/up/silu/mul/down structure makes it fused_mlp.
  const Profile profile = timed_step("mistral");
  const Plan plan = plan_of(profile);
  expect_attributed(profile, plan);
  EXPECT_EQ(named_rows(plan), decoder_rows(2048, 16, 8, 5632, 32000));
  EXPECT_EQ(test::row(plan, "fused_mlp", "4096x2048x5632").rules.count("module-swiglu-structure"),
            1u);
}

TEST(HfProfiles, Gpt2LayerNormsGeluAndConv1dProjections) {
  // hidden 1024, 16 heads of 64, MLP 4096, vocab 50257, 1024 positions; Conv1D layers (addmm
  // with a bias: matmul_bias); the LM head has none.
  const Profile profile = timed_step("gpt2");
  const Plan plan = plan_of(profile);
  expect_attributed(profile, plan);
  const std::vector<Row> expected = sorted({
      {"embedding", "4x1024x1024", "bf16", 1},  // tokens
      {"embedding", "1x1024x1024", "bf16", 1},  // positions
      {"layernorm", "4096x1024", "bf16", 1},    // layer 0's ln_1
      {"residual_add+layernorm", "4096x1024", "bf16", 4},
      {"matmul_bias", "4096x3072x1024", "bf16", 2},  // c_attn
      {"matmul_bias", "4096x1024x1024", "bf16", 2},  // attention c_proj
      {"matmul_bias", "4096x4096x1024", "bf16", 2},  // c_fc
      {"matmul_bias", "4096x1024x4096", "bf16", 2},  // MLP c_proj
      {"gelu", "4x1024x4096", "bf16", 2},
      {"flash_attention", "4x16x1024x64,causal=1,scale_permille=0", "bf16", 2},
      {"kv_cache", "4x16x1024x64", "bf16", 4},
      {"matmul", "4096x50257x1024", "bf16", 1},
      {"cast+cross_entropy", "4096x50257", "bf16", 1},
  });
  EXPECT_EQ(named_rows(plan), expected);
}

TEST(HfProfiles, BertEncoderWithMaskedLmHead) {
  // hidden 1024, 16 heads of 64, intermediate 4096, vocab 30522, batch 4 x 512, bidirectional.
  const Profile profile = timed_step("bert");
  const Plan plan = plan_of(profile);
  expect_attributed(profile, plan);
  const std::vector<Row> expected = sorted({
      {"embedding", "4x512x1024", "bf16", 2},  // words, token types
      {"embedding", "1x512x1024", "bf16", 1},  // positions
      {"layernorm", "2048x1024", "bf16", 2},   // embeddings (after an in-place add), MLM head
      {"residual_add+layernorm", "2048x1024", "bf16", 4},
      // Every linear layer has a bias: q, k, v, output per layer and the head's dense...
      {"matmul_bias", "2048x1024x1024", "bf16", 9},
      {"matmul_bias", "2048x4096x1024", "bf16", 2},
      {"matmul_bias", "2048x1024x4096", "bf16", 2},
      {"gelu", "4x512x4096", "bf16", 2},
      {"gelu", "4x512x1024", "bf16", 1},  // the MLM head's transform
      {"flash_attention", "4x16x512x64,causal=0,scale_permille=0", "bf16", 2},
      {"matmul_bias", "2048x30522x1024", "bf16", 1},  // ... and its decoder
      {"cross_entropy", "2048x30522", "bf16", 1},
  });
  EXPECT_EQ(named_rows(plan), expected);
}

}  // namespace
}  // namespace kforge
