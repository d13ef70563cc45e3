// What the example models (python/examples) run in one inference step at their default sizes,
// as plan rows: the expectations that the recorded-profile tests and the GPU tests share. They
// follow from the models' code (layer count, widths, which modules each layer calls), not from
// kforge.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "profile/planner.h"

namespace kforge::test {

// (op, shape, dtype, calls) of a plan row.
using RowKey = std::tuple<std::string, std::string, std::string, int64_t>;

// The kforge-op rows of a plan, sorted.
inline std::vector<RowKey> kforge_rows(const Plan& plan) {
  std::vector<RowKey> rows;
  for (const auto& g : plan.groups) {
    if (g.op != "other") rows.emplace_back(g.op, g.shape, dtype_name(*g.dtype), g.calls);
  }
  std::sort(rows.begin(), rows.end());
  return rows;
}

// llama.py: batch 4 x seq 512, dim 1024, 16 heads of 64, SwiGLU 2816, vocab 16384, bf16. Per
// layer 2 RMSNorms, RoPE on q and k, q/k/v/o projections, one causal attention, one SwiGLU; then
// the final RMSNorm, the LM head and the loss.
inline std::vector<RowKey> llama_step_rows(int64_t layers) {
  std::vector<RowKey> rows = {
      {"cross_entropy", "2048x16384", "bf16", 1},
      {"flash_attention", "4x16x512x64,causal=1,scale_permille=0", "bf16", layers},
      {"fused_mlp", "2048x1024x2816", "bf16", layers},
      {"matmul", "2048x1024x1024", "bf16", 4 * layers},
      {"matmul", "2048x16384x1024", "bf16", 1},
      {"rmsnorm", "2048x1024", "bf16", 2 * layers + 1},
      {"rotary_embedding_half", "4x16x512x64", "bf16", 2 * layers},
  };
  std::sort(rows.begin(), rows.end());
  return rows;
}

// gpt2.py: batch 8 x seq 512, dim 768, 12 heads, MLP 3072, vocab 16384. Per layer 2 LayerNorms,
// the fused qkv projection, one causal attention, the output projection and the two MLP GEMMs
// (each with its bias: matmul_bias); then the final LayerNorm, the LM head (no bias) and the loss.
inline std::vector<RowKey> gpt2_step_rows(int64_t layers) {
  std::vector<RowKey> rows = {
      {"cross_entropy", "4096x16384", "bf16", 1},
      {"flash_attention", "8x12x512x64,causal=1,scale_permille=0", "bf16", layers},
      {"layernorm", "4096x768", "bf16", 2 * layers + 1},
      {"matmul", "4096x16384x768", "bf16", 1},
      {"matmul_bias", "4096x2304x768", "bf16", layers},
      {"matmul_bias", "4096x3072x768", "bf16", layers},
      {"matmul_bias", "4096x768x3072", "bf16", layers},
      {"matmul_bias", "4096x768x768", "bf16", layers},
  };
  std::sort(rows.begin(), rows.end());
  return rows;
}

// bert.py: batch 16 x seq 256, dim 768, 12 heads of 64, MLP 3072, 4 classes. The embeddings'
// LayerNorm; per layer q/k/v/out projections, attention as matmul -> softmax -> matmul (batched
// over 16 x 12 heads), 2 LayerNorms and the two MLP GEMMs; then the pooler and the classifier on
// the first token and cross-entropy over the 4 classes. Every linear layer has a bias.
inline std::vector<RowKey> bert_step_rows(int64_t layers) {
  std::vector<RowKey> rows = {
      {"cross_entropy", "16x4", "bf16", 1},
      {"layernorm", "4096x768", "bf16", 2 * layers + 1},
      {"matmul_bias", "16x4x768", "bf16", 1},
      {"matmul_bias", "16x768x768", "bf16", 1},
      {"matmul_bias", "4096x3072x768", "bf16", layers},
      {"matmul_bias", "4096x768x3072", "bf16", layers},
      {"matmul_bias", "4096x768x768", "bf16", 4 * layers},
      // The attention is written out (q k^T, scale, mask, softmax, times v): one eager-attention
      // call per layer (fusion.h), 16 sequences x 12 heads x 256 tokens x 64.
      {"flash_attention", "16x12x256x64,causal=0,scale_permille=0", "bf16", layers},
  };
  std::sort(rows.begin(), rows.end());
  return rows;
}

}  // namespace kforge::test
