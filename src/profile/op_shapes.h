// From a kernel's CPU-side context to a kforge problem: which op, at which sizes, in which dtype.
//
// PyTorch's `torch.autograd.profiler.emit_nvtx(record_shapes=True)` names each op's NVTX range
//   "aten::addmm, seq = 12, op_id = 34, sizes = [[512], [8, 512], [512, 512], [], []],
//    input_op_ids = [(0,-1), (30,0), (31,0), (0,-1), (0,-1)]"
// (seq only for ops autograd records, one size list per input, [] for scalars and lists), and the
// example models name module ranges "module::RMSNorm, sizes = [[2, 128, 512], [512]]". Contexts
// from a torch.profiler trace arrive with their dims (and dtypes) already split out. Both become
// a ContextOp; map_problem() then reads the op's inputs as a kforge problem (docs/planning.md
// lists the rules).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "ops/op_spec.h"
#include "profile/profile.h"

namespace kforge {

// One context entry with its text taken apart.
struct ContextOp {
  std::string name;  // "aten::addmm", "module::RMSNorm", or the whole text when it is no op text
  std::string text;  // as recorded
  std::vector<std::vector<int64_t>> input_dims;  // one entry per input ([] for non-tensors)
  std::vector<std::string> input_types;          // "c10::BFloat16", "float", ... when recorded
  std::map<std::string, std::string, std::less<>> fields;  // other "key = value" items
  // The entry names one call: its OpContext carries a call number, or its text PyTorch's seq or
  // op_id, which differ from call to call. Two kernels whose entries are equal (text and call
  // number) were launched by the same call.
  bool identifies_call = false;
};

ContextOp parse_context(const OpContext& context);

// "c10::BFloat16" -> bf16, "c10::Half" -> f16, "float" -> f32, "double" -> f64; nullopt for
// others (integer tensors, unknown names).
std::optional<DType> dtype_from_torch_type(std::string_view type);

// "1", "True", "true" -> true; "0", "False", "false" -> false (spaces around allowed).
std::optional<bool> parse_flag(std::string_view value);

// What the kernels of a call can add to its context: attention kernels may say causal or not.
struct ShapeHints {
  std::optional<bool> causal;
};

struct MappedProblem {
  std::string op;                  // a kforge op name: the one asked for, or a matmul's epilogue
                                   // variant (matmul_bias, matmul_residual) where the call adds
                                   // a bias or a whole matrix to the product
  Sizes sizes;                     // by the op spec's size names, completed (complete_sizes)
  std::optional<DType> dtype;      // from the op's input types, when recorded
  std::vector<std::string> notes;  // assumptions made, e.g. "batch 8 folded into M"
};

// The problem one call of `context` poses to kforge op `op`, or nullopt with the reason in
// *why_not when its recorded inputs do not determine one.
std::optional<MappedProblem> map_problem(std::string_view op, const ContextOp& context,
                                         const ShapeHints& hints, std::string* why_not = nullptr);

}  // namespace kforge
