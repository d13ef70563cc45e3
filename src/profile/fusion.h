// Composite ops and fusion groups: what one kernel's context cannot say, found among the calls
// around it.
//
// classify.h decides kernel by kernel. A model as it is (a Hugging Face model, unannotated) runs
// several of kforge's ops as chains of ATen calls inside a module's forward, and does work no
// kforge op does between them. This pass reads the kernels' contexts as a call tree (each
// context entry a node, its children the calls made inside it, in launch order) and regroups:
//
//   1. Op patterns among the children of one node (a module's forward), each a row of
//      op_patterns(): rotate-half RoPE (mul, neg, cat, mul, add), interleaved RoPE (mul, neg,
//      stack, mul, add), eager attention (matmul, [div|mul], [add], softmax, [to], [dropout],
//      matmul), an eager RMSNorm outside a norm module, log_softmax + nll_loss, and a cat onto an
//      empty or growing cache (the named group kv_cache). The matched calls become one call with
//      a problem read from their inputs.
//   2. SwiGLU modules by structure: a module whose children are exactly linear, silu, linear,
//      mul, linear (gate and up in either order) is one fused_mlp call, whatever its class name.
//   3. Attachments: a residual add whose result the next call (a norm of the same shape) reads
//      joins that norm as `residual_add+rmsnorm` (or +layernorm); a cast or copy that the next
//      kforge op reads (logits.float() before the loss) joins it as `cast+cross_entropy`, and the
//      group is costed in the dtype the model computes in.
//
// Only kernels that no enclosing rule decided are regrouped, and only calls that the profile
// identifies one by one (OpContext::call, PyTorch's op_id).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "profile/classify.h"
#include "profile/op_shapes.h"
#include "profile/profile.h"

namespace kforge {

// What the planner knows of one kernel.
struct KernelFacts {
  Classification what;
  std::vector<const ContextOp*> context;  // outermost first
  std::string_view name;                  // demangled when there is one
};

// One row of op patterns: the labels of consecutive children of one node ("mul", or
// alternatives "div|mul"; a trailing '?' makes a step optional).
struct OpPattern {
  std::string_view id;
  std::vector<std::string_view> steps;
  std::string_view op;     // a kforge op, or "other" with a named group
  std::string_view group;  // the named group for op "other"
  std::string_view why;
  // The matched calls' inputs as the dims (and types) map_problem or named_group_call reads for
  // the op or group; nullopt when they do not fit it (the match is then not taken).
  std::optional<ContextOp> (*read_inputs)(std::span<const ContextOp* const> calls);
};
std::span<const OpPattern> op_patterns();

// What a call gained from attachments, by its deciding context entry.
struct Fusion {
  std::string name;               // "residual_add+rmsnorm", "cast+cross_entropy"
  int64_t extra_elements = 0;     // elements the attached work must move besides the op's own
  bool dtype_from_range = false;  // an attached cast: cost in the dtype of the code around it
  std::vector<std::string> notes;
};

using Fusions = std::unordered_map<const ContextOp*, Fusion>;

// Regroups `kernels` (indexed like profile.kernels; `order` lists them per process and stream
// in start order). Entries made for pattern calls are kept in `synthetic`, which must outlive
// the facts.
Fusions find_fusions(const Profile& profile, const std::vector<size_t>& order,
                     std::vector<KernelFacts>& kernels, std::deque<ContextOp>& synthetic);

// One call of a named group, from its deciding entry.
struct NamedGroupCall {
  std::vector<int64_t> shape;  // of the tensor it makes
  int64_t elements = 0;        // its compulsory traffic: inputs read once, the output written once
  size_t dtype_input = 0;      // the input whose dtype is the group's
};
// nullopt when the entry's inputs do not say (or the group has no such rule: rope_tables).
std::optional<NamedGroupCall> named_group_call(std::string_view group, const ContextOp& entry);

}  // namespace kforge
