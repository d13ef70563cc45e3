// The op specs kforge knows. Adding an op: write its spec in one file and list its factory in
// registry.cpp.
#pragma once

#include <memory>

#include "ops/op_spec.h"

namespace kforge {

std::unique_ptr<OpSpec> make_matmul_spec();
std::unique_ptr<OpSpec> make_matmul_bias_spec();
std::unique_ptr<OpSpec> make_matmul_residual_spec();
std::unique_ptr<OpSpec> make_softmax_spec();
std::unique_ptr<OpSpec> make_layernorm_spec();
std::unique_ptr<OpSpec> make_rmsnorm_spec();
std::unique_ptr<OpSpec> make_flash_attention_spec();
std::unique_ptr<OpSpec> make_fused_mlp_spec();
std::unique_ptr<OpSpec> make_cross_entropy_spec();
std::unique_ptr<OpSpec> make_rotary_embedding_spec();
std::unique_ptr<OpSpec> make_rotary_embedding_half_spec();
std::unique_ptr<OpSpec> make_reduce_spec();

}  // namespace kforge
