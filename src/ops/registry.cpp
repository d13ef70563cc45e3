#include "ops/registry.h"

#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kforge {
namespace {

const std::vector<std::unique_ptr<OpSpec>>& registry() {
  static const auto specs = [] {
    std::vector<std::unique_ptr<OpSpec>> v;
    v.push_back(make_matmul_spec());
    v.push_back(make_softmax_spec());
    v.push_back(make_layernorm_spec());
    v.push_back(make_rmsnorm_spec());
    v.push_back(make_flash_attention_spec());
    v.push_back(make_fused_mlp_spec());
    v.push_back(make_cross_entropy_spec());
    v.push_back(make_rotary_embedding_spec());
    v.push_back(make_rotary_embedding_half_spec());
    v.push_back(make_reduce_spec());
    v.push_back(make_matmul_bias_spec());
    v.push_back(make_matmul_residual_spec());
    return v;
  }();
  return specs;
}

// Ops added while kforge runs (KernelBench problems), and what loads one by name.
struct RuntimeOps {
  std::mutex mutex;
  std::vector<std::unique_ptr<OpSpec>> specs;
  std::function<const OpSpec*(std::string_view)> resolver;
};

RuntimeOps& runtime_ops() {
  static RuntimeOps ops;
  return ops;
}

}  // namespace

const OpSpec* find_op(std::string_view name) {
  for (const auto& spec : registry()) {
    if (spec->name() == name) return spec.get();
  }
  std::function<const OpSpec*(std::string_view)> resolver;
  {
    auto& runtime = runtime_ops();
    const std::lock_guard lock(runtime.mutex);
    for (const auto& spec : runtime.specs) {
      if (spec->name() == name) return spec.get();
    }
    resolver = runtime.resolver;
  }
  // Outside the lock: the resolver registers what it loads.
  return resolver ? resolver(name) : nullptr;
}

const OpSpec* register_op(std::unique_ptr<OpSpec> spec) {
  auto& runtime = runtime_ops();
  const std::lock_guard lock(runtime.mutex);
  runtime.specs.push_back(std::move(spec));
  return runtime.specs.back().get();
}

void set_op_resolver(std::function<const OpSpec*(std::string_view)> resolver) {
  auto& runtime = runtime_ops();
  const std::lock_guard lock(runtime.mutex);
  runtime.resolver = std::move(resolver);
}

std::string starter_kernel(std::string_view op, bool cuda, DType dtype) {
  if (!cuda) return fmt::format("{0}/{0}_cpu.cpp", op);
  // 16-bit GEMMs run on the tensor cores (CUTLASS); fp32 stays on the FFMA tiles.
  if ((op == "matmul" || op == "fused_mlp") && dtype_size(dtype) == 2) {
    return fmt::format("{0}/{0}_wgmma.cu", op);
  }
  // The matmuls with an epilogue have their CUTLASS file alone (f16 and bf16, Hopper only): in
  // f32 or on another GPU it is still the starter, so that the error names it and says why.
  if (op == "matmul_bias" || op == "matmul_residual") return fmt::format("{0}/{0}_wgmma.cu", op);
  // Attention takes f16 and bf16 only, on the tensor cores (flash_attention_tiled.cu, its
  // CUDA-core predecessor, stays in the library as a second file).
  if (op == "flash_attention") return "flash_attention/flash_attention_wgmma.cu";
  const bool tiled = op == "matmul" || op == "fused_mlp";
  return fmt::format("{0}/{0}_{1}.cu", op, tiled ? "tiled" : "rowblock");
}

std::vector<const OpSpec*> all_ops() {
  std::vector<const OpSpec*> out;
  for (const auto& spec : registry())
    out.push_back(spec.get());
  return out;
}

std::string op_names() {
  std::vector<std::string_view> names;
  for (const auto& spec : registry())
    names.push_back(spec->name());
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace kforge
