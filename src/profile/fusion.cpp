#include "profile/fusion.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <optional>

#include <fmt/format.h>

namespace kforge {
namespace {

using Dims = std::vector<int64_t>;

// Elements of a recorded tensor; 0 for an empty one and for a non-tensor ([]).
int64_t elements(const Dims& dims) {
  if (dims.empty()) return 0;
  return std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<>());
}

const Dims& input(const ContextOp& op, size_t i) {
  static const Dims none;
  return i < op.input_dims.size() ? op.input_dims[i] : none;
}

// "mul" for "aten::mul"; other names as they are.
std::string_view op_label(const ContextOp& op) {
  std::string_view name = op.name;
  if (name.starts_with("aten::")) name.remove_prefix(6);
  return name;
}

bool step_accepts(std::string_view step, std::string_view label) {
  if (step.ends_with('?')) step.remove_suffix(1);
  while (!step.empty()) {
    const size_t bar = step.find('|');
    if (step.substr(0, bar) == label) return true;
    if (bar == std::string_view::npos) break;
    step.remove_prefix(bar + 1);
  }
  return false;
}

// The first of the calls whose label a step accepts.
const ContextOp* first_accepted(std::span<const ContextOp* const> calls, std::string_view step) {
  for (const ContextOp* c : calls) {
    if (step_accepts(step, op_label(*c))) return c;
  }
  return nullptr;
}

// Readers of a matched pattern's inputs: the dims (and types) that map_problem, or
// named_group_call, reads for the pattern's op; nullopt when they do not fit it.

// mul(x [B, H, S, D], cos [.., S, D]): the rotary mapping reads x and a [S, D] table.
std::optional<ContextOp> rope_inputs(std::span<const ContextOp* const> calls) {
  const ContextOp& mul = *calls.front();
  const Dims &x = input(mul, 0), &cos = input(mul, 1);
  if (x.size() != 4 || cos.size() < 2 || cos.back() != x.back()) return std::nullopt;
  ContextOp entry;
  entry.input_dims = {x, Dims(cos.end() - 2, cos.end())};
  entry.input_types = mul.input_types;
  return entry;
}

// matmul(q [B, H, S, D], k^T [B, H, D, S]) ... matmul(p [B, H, S, S], v [B, H, S, D]).
std::optional<ContextOp> attention_inputs(std::span<const ContextOp* const> calls) {
  const ContextOp &qk = *calls.front(), &pv = *calls.back();
  const Dims &q = input(qk, 0), &kt = input(qk, 1), &v = input(pv, 1);
  if (q.size() != 4 || kt.size() != 4 || v.size() != 4) return std::nullopt;
  ContextOp entry;
  entry.input_dims = {q, Dims{kt[0], kt[1], kt[3], kt[2]}, v};
  entry.input_types = qk.input_types;
  return entry;
}

// pow(x, 2) ... mul(weight [D], y) (either order).
std::optional<ContextOp> rmsnorm_inputs(std::span<const ContextOp* const> calls) {
  const ContextOp* pow = first_accepted(calls, "pow");
  const ContextOp& scale = *calls.back();
  if (!pow) return std::nullopt;
  const Dims& x = input(*pow, 0);
  Dims weight;
  for (size_t i = 0; i < 2; ++i) {
    if (input(scale, i).size() == 1) weight = input(scale, i);
  }
  if (x.empty() || weight.empty() || weight.back() != x.back()) return std::nullopt;
  ContextOp entry;
  entry.input_dims = {x, weight};
  entry.input_types = calls.front()->input_types;
  return entry;
}

// log_softmax(logits [N, V]), nll_loss(.., target [N]).
std::optional<ContextOp> cross_entropy_inputs(std::span<const ContextOp* const> calls) {
  const ContextOp* log_softmax = first_accepted(calls, "log_softmax");
  const ContextOp* nll = first_accepted(calls, "nll_loss|nll_loss_nd");
  if (!log_softmax || !nll) return std::nullopt;
  ContextOp entry;
  entry.input_dims = {input(*log_softmax, 0), input(*nll, 1)};
  entry.input_types = calls.front()->input_types;
  return entry;
}

// A cat that appends to a cache: onto an empty tensor (the first step of Hugging Face's
// DynamicCache), or onto a tensor equal in every dim but the sequence (dim -2). The cat's own
// inputs, for named_group_call.
std::optional<ContextOp> cache_append_inputs(std::span<const ContextOp* const> calls) {
  const ContextOp& cat = *calls.front();
  const Dims &cache = input(cat, 0), &added = input(cat, 1);
  if (added.size() < 3) return std::nullopt;
  bool appends = elements(cache) == 0 && !cache.empty();
  if (!appends && cache.size() == added.size()) {
    appends = true;
    for (size_t i = 0; i < cache.size(); ++i)
      appends = appends && (i + 2 == cache.size() || cache[i] == added[i]);
  }
  if (!appends) return std::nullopt;
  ContextOp entry;
  entry.input_dims = cat.input_dims;
  entry.input_types = cat.input_types;
  return entry;
}

const OpPattern kPatterns[] = {
    {"rope-rotate-half",
     {"mul", "neg", "cat", "mul", "add"},
     "rotary_embedding_half",
     "",
     "x*cos + rotate_half(x)*sin: the halves (x[i], x[i + D/2]) rotated (Hugging Face "
     "apply_rotary_pos_emb)",
     rope_inputs},
    {"rope-interleaved",
     {"mul", "neg", "stack", "mul", "add"},
     "rotary_embedding",
     "",
     "x*cos + stack(-x[1::2], x[::2])*sin: interleaved pairs (x[2i], x[2i+1]) rotated",
     rope_inputs},
    {"eager-attention",
     {"matmul|bmm", "div|mul?", "add?", "softmax|_softmax|_safe_softmax", "to?", "dropout?",
      "matmul|bmm"},
     "flash_attention",
     "",
     "attention written out: q k^T, scale, mask, softmax, times v",
     attention_inputs},
    {"rmsnorm-chain",
     {"to?", "pow", "mean", "add", "rsqrt", "mul", "to?", "mul"},
     "rmsnorm",
     "",
     "an RMS norm written out: x * rsqrt(mean(x^2) + eps) * weight",
     rmsnorm_inputs},
    {"cross-entropy-chain",
     {"to?", "log_softmax", "nll_loss|nll_loss_nd"},
     "cross_entropy",
     "",
     "log_softmax then nll_loss: a cross-entropy loss",
     cross_entropy_inputs},
    {"kv-cache",
     {"cat"},
     "other",
     "kv_cache",
     "keys or values appended to a cache",
     cache_append_inputs},
};

// The labels of the SwiGLU MLP structure (a module's whole forward).
const std::vector<std::vector<std::string_view>> kSwigluBodies = {
    {"linear", "silu", "linear", "mul", "linear"},
    {"linear", "linear", "silu", "mul", "linear"},
};

// The call tree of the kernels' contexts.
struct Node {
  const ContextOp* entry = nullptr;  // null for the root
  size_t parent = 0;                 // the root is its own parent
  int depth = -1;                    // index of entry in its kernels' contexts
  std::vector<size_t> children;      // nodes, in launch order
  std::vector<size_t> kernels;       // every kernel of its subtree, in launch order
  // "mul" for aten::mul; a module whose forward is one op call is labelled by that op (a Linear
  // is "linear", SiLUActivation "silu"); other modules "module".
  std::string label;
};

class CallTree {
 public:
  CallTree(const std::vector<size_t>& order, const std::vector<KernelFacts>& kernels) {
    nodes_.emplace_back();  // the root
    std::map<std::pair<size_t, const ContextOp*>, size_t> index;
    for (const size_t k : order) {
      size_t at = 0;
      nodes_[at].kernels.push_back(k);
      const auto& chain = kernels[k].context;
      for (size_t i = 0; i < chain.size(); ++i) {
        auto found = index.find({at, chain[i]});
        if (found == index.end()) {
          Node node;
          node.entry = chain[i];
          node.parent = at;
          node.depth = static_cast<int>(i);
          nodes_.push_back(std::move(node));
          found = index.emplace(std::pair(at, chain[i]), nodes_.size() - 1).first;
          nodes_[at].children.push_back(found->second);
        }
        at = found->second;
        nodes_[at].kernels.push_back(k);
      }
    }
    // Children come after their parents: label from the leaves up.
    for (size_t n = nodes_.size(); n-- > 1;) {
      Node& node = nodes_[n];
      if (module_class(node.entry->name).empty()) {
        node.label = op_label(*node.entry);
      } else if (node.children.size() == 1 && !is_module(nodes_[node.children[0]])) {
        node.label = nodes_[node.children[0]].label;
      } else {
        node.label = "module";
      }
    }
  }

  const std::vector<Node>& nodes() const { return nodes_; }

  static bool is_module(const Node& node) {
    return node.entry && !module_class(node.entry->name).empty();
  }

  std::vector<std::string> child_labels(const Node& node) const {
    std::vector<std::string> labels;
    for (const size_t c : node.children)
      labels.push_back(nodes_[c].label);
    return labels;
  }

 private:
  std::vector<Node> nodes_;
};

// Matches steps[s..] against labels[at..]; returns the number of labels used, or nullopt.
// Optional steps are tried taken first, then skipped.
std::optional<size_t> match_steps(const std::vector<std::string_view>& steps, size_t s,
                                  const std::vector<std::string>& labels, size_t at) {
  if (s == steps.size()) return size_t{0};
  const bool optional = steps[s].ends_with('?');
  if (at < labels.size() && step_accepts(steps[s], labels[at])) {
    if (const auto rest = match_steps(steps, s + 1, labels, at + 1)) return *rest + 1;
  }
  if (optional) return match_steps(steps, s + 1, labels, at);
  return std::nullopt;
}

const char* const kCastOps[] = {"to", "_to_copy", "copy_", "type_as", "contiguous", "clone"};

bool is_cast(std::string_view label) {
  return std::find(std::begin(kCastOps), std::end(kCastOps), label) != std::end(kCastOps);
}

class FusionFinder {
 public:
  FusionFinder(const Profile& profile, const std::vector<size_t>& order,
               std::vector<KernelFacts>& kernels, std::deque<ContextOp>& synthetic)
      : kernels_(kernels), synthetic_(synthetic), tree_(order, kernels) {
    next_.assign(kernels.size(), kNone);
    for (size_t i = 0; i + 1 < order.size(); ++i) {
      const KernelRecord &a = profile.kernels[order[i]], &b = profile.kernels[order[i + 1]];
      if (a.pid == b.pid && a.stream == b.stream) next_[order[i]] = order[i + 1];
    }
  }

  Fusions run() {
    const auto& nodes = tree_.nodes();
    for (const Node& node : nodes) {
      const std::vector<std::string> labels = tree_.child_labels(node);
      if (!swiglu_module(node, labels)) match_patterns(node, labels);
    }
    for (size_t n = 1; n < nodes.size(); ++n)
      attach(nodes[n]);
    return std::move(result_);
  }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);

  // Whether the node's kernels are free to regroup: every one identified call by call and none
  // decided by an enclosing rule at or above `depth`.
  bool free_below(const Node& node, int depth) const {
    if (node.entry && !node.entry->identifies_call) return false;
    return std::all_of(node.kernels.begin(), node.kernels.end(), [&](size_t k) {
      const Classification& c = kernels_[k].what;
      return !(c.enclosing && c.context_index <= depth);
    });
  }

  bool all_other(const Node& node) const {
    return std::all_of(node.kernels.begin(), node.kernels.end(), [&](size_t k) {
      return kernels_[k].what.op == "other" && kernels_[k].what.group.empty();
    });
  }

  void decide(size_t k, int index, std::string_view op, std::string_view group, std::string rule,
              std::string_view why) {
    Classification& c = kernels_[k].what;
    c = Classification{std::string(op),
                       std::move(rule),
                       std::string(why),
                       Evidence::context_op,
                       index,
                       std::string(group),
                       true};
  }

  bool swiglu_module(const Node& node, const std::vector<std::string>& labels) {
    if (!CallTree::is_module(node)) return false;
    const bool matches = std::any_of(kSwigluBodies.begin(), kSwigluBodies.end(), [&](auto& body) {
      return std::equal(body.begin(), body.end(), labels.begin(), labels.end());
    });
    if (!matches || !free_below(node, node.depth)) return false;
    for (const size_t k : node.kernels)
      decide(k, node.depth, "fused_mlp", "", "module-swiglu-structure",
             "a module whose forward is gate and up projections, silu, multiply, down "
             "projection: a SwiGLU MLP");
    return true;
  }

  void match_patterns(const Node& node, const std::vector<std::string>& labels) {
    for (size_t at = 0; at < labels.size();) {
      size_t used = 0;
      for (const OpPattern& pattern : kPatterns) {
        const auto length = match_steps(pattern.steps, 0, labels, at);
        if (!length || *length == 0) continue;
        if (apply(node, pattern, at, *length)) {
          used = *length;
          break;
        }
      }
      at += used ? used : 1;
    }
  }

  bool apply(const Node& node, const OpPattern& pattern, size_t at, size_t length) {
    const auto& nodes = tree_.nodes();
    std::vector<const ContextOp*> calls;
    for (size_t i = at; i < at + length; ++i) {
      const Node& child = nodes[node.children[i]];
      if (!free_below(child, node.depth)) return false;
      calls.push_back(child.entry);
    }
    std::optional<ContextOp> entry = pattern.read_inputs(calls);
    if (!entry) return false;
    entry->name = fmt::format("pattern::{}", pattern.id);
    entry->text = entry->name;
    entry->identifies_call = true;
    const ContextOp* made = &synthetic_.emplace_back(std::move(*entry));
    const int index = node.depth + 1;  // where the children's entries sit in their contexts
    for (size_t i = at; i < at + length; ++i) {
      for (const size_t k : nodes[node.children[i]].kernels) {
        // The pattern's call sits between the module and the ATen calls it groups.
        auto& context = kernels_[k].context;
        context.insert(context.begin() + index, made);
        decide(k, index, pattern.op, pattern.group, fmt::format("pattern-{}", pattern.id),
               pattern.why);
      }
    }
    return true;
  }

  // The kernel after the node's last one on its stream, when it opens a kforge op's call that
  // the profile identifies.
  std::optional<size_t> following_op_kernel(const Node& node, size_t skip_at_most) const {
    size_t k = next_[node.kernels.back()];
    for (size_t skipped = 0; k != kNone; k = next_[k], ++skipped) {
      const Classification& c = kernels_[k].what;
      if (c.op != "other" && c.context_index >= 0) {
        if (!kernels_[k].context[static_cast<size_t>(c.context_index)]->identifies_call)
          return std::nullopt;
        return k;
      }
      if (skipped == skip_at_most) break;
    }
    return std::nullopt;
  }

  // The node's kernels join the call `target` opens, under rule `rule`; the call gains `name`,
  // the elements the node's work still moves, and the note.
  void join(const Node& node, size_t target, std::string_view rule, std::string name,
            int64_t extra_elements, bool dtype_from_range, std::string note) {
    const Classification target_class = kernels_[target].what;
    const ContextOp* entry =
        kernels_[target].context[static_cast<size_t>(target_class.context_index)];
    for (const size_t k : node.kernels) {
      auto& context = kernels_[k].context;
      context.push_back(entry);
      kernels_[k].what = target_class;
      kernels_[k].what.context_index = static_cast<int>(context.size()) - 1;
      kernels_[k].what.rule = std::string(rule);
      kernels_[k].what.reason = note;
    }
    Fusion& fusion = result_[entry];
    fusion.name = std::move(name);
    fusion.extra_elements += extra_elements;
    fusion.dtype_from_range = fusion.dtype_from_range || dtype_from_range;
    if (std::find(fusion.notes.begin(), fusion.notes.end(), note) == fusion.notes.end())
      fusion.notes.push_back(std::move(note));
  }

  void attach(const Node& node) {
    if (!node.entry->identifies_call || CallTree::is_module(node)) return;
    // Only calls a module's forward (or the top level) made itself: the ops inside an op are
    // part of it.
    const Node& parent = tree_.nodes()[node.parent];
    if (parent.entry && !CallTree::is_module(parent)) return;
    if (!all_other(node)) return;
    const std::string& label = node.label;
    const Dims& x = input(*node.entry, 0);
    if (label == "add" && x.size() >= 2 && input(*node.entry, 1) == x) {
      const auto target = following_op_kernel(node, 0);
      if (!target) return;
      const Classification& c = kernels_[*target].what;
      const ContextOp& norm = *kernels_[*target].context[static_cast<size_t>(c.context_index)];
      if ((c.op != "rmsnorm" && c.op != "layernorm") || input(norm, 0) != x) return;
      join(node, *target, "attached-residual-add", fmt::format("residual_add+{}", c.op),
           2 * elements(x), false,
           "a residual add whose sum the norm reads: fused, it reads the residual and writes the "
           "sum once more");
      return;
    }
    if (is_cast(label) && !x.empty()) {
      // Small calls may sit between (the labels shifted for a loss); at most a few kernels.
      const auto target = following_op_kernel(node, 4);
      if (!target) return;
      const Classification& c = kernels_[*target].what;
      const ContextOp& consumer = *kernels_[*target].context[static_cast<size_t>(c.context_index)];
      if (elements(input(consumer, 0)) != elements(x)) return;
      join(node, *target, "attached-cast", fmt::format("cast+{}", c.op), 0, true,
           fmt::format("a {} of its input just before it: fused, the op reads the tensor as the "
                       "model made it",
                       label));
    }
  }

  std::vector<KernelFacts>& kernels_;
  std::deque<ContextOp>& synthetic_;
  CallTree tree_;
  std::vector<size_t> next_;  // the next kernel on the same process and stream
  Fusions result_;
};

}  // namespace

std::span<const OpPattern> op_patterns() {
  return kPatterns;
}

Fusions find_fusions(const Profile& profile, const std::vector<size_t>& order,
                     std::vector<KernelFacts>& kernels, std::deque<ContextOp>& synthetic) {
  return FusionFinder(profile, order, kernels, synthetic).run();
}

std::optional<NamedGroupCall> named_group_call(std::string_view group, const ContextOp& entry) {
  const Dims &a = input(entry, 0), &b = input(entry, 1);
  if (group == "gelu" && elements(a) > 0) return NamedGroupCall{a, 2 * elements(a), 0};
  if (group == "kv_cache" && elements(b) > 0) {
    // cat(cache, new): the cache grown by the new keys or values along dim -2.
    Dims made = b;
    if (a.size() == b.size()) made[made.size() - 2] += a[a.size() - 2];
    return NamedGroupCall{made, elements(a) + elements(b) + elements(made), 1};
  }
  if (group == "embedding" && a.size() == 2 && elements(b) > 0) {
    // embedding(weight [V, D], indices [..]): a row read and written per index.
    Dims made = b;
    made.push_back(a[1]);
    return NamedGroupCall{made, 2 * elements(made), 0};
  }
  return std::nullopt;
}

}  // namespace kforge
