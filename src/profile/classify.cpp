#include "profile/classify.h"

#include <algorithm>
#include <cctype>
#include <regex>

namespace kforge {
namespace {

// The top-level template arguments of the first "prefix<...>" in a demangled name.
std::optional<std::vector<std::string_view>> template_args(std::string_view name,
                                                           std::string_view prefix) {
  const size_t at = name.find(prefix);
  if (at == std::string_view::npos) return std::nullopt;
  const auto trimmed = [&](size_t begin, size_t end) {
    std::string_view s = name.substr(begin, end - begin);
    while (!s.empty() && s.front() == ' ')
      s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ')
      s.remove_suffix(1);
    return s;
  };
  std::vector<std::string_view> args;
  int depth = 0;
  size_t start = at + prefix.size();
  for (size_t i = start; i < name.size(); ++i) {
    const char c = name[i];
    if (c == '<' || c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if (c == '>' || c == ')' || c == ']' || c == '}') {
      if (depth == 0) {
        if (c != '>') return std::nullopt;
        args.push_back(trimmed(start, i));
        return args;
      }
      --depth;
    } else if (c == ',' && depth == 0) {
      args.push_back(trimmed(start, i));
      start = i + 1;
    }
  }
  return std::nullopt;
}

// A bool template argument as demanglers and tools print it: true, 1, (bool)1.
std::optional<bool> flag_arg(std::string_view arg) {
  if (arg.starts_with("(bool)")) arg.remove_prefix(6);
  if (arg == "true" || arg == "1") return true;
  if (arg == "false" || arg == "0") return false;
  return std::nullopt;
}

// softmax_warp_forward<input_t, output_t, acc_t, log2_elements, is_log_softmax, ...>.
bool is_log_softmax_warp(std::string_view name) {
  const auto args = template_args(name, "softmax_warp_forward<");
  return args && args->size() > 4 && flag_arg((*args)[4]).value_or(false);
}

constexpr auto op_name = RuleTarget::op_name;
constexpr auto module_class_name = RuleTarget::module_class;
constexpr auto encloses = RuleScope::encloses;
constexpr auto innermost = RuleScope::innermost;

// Context rules. When several entries of one kernel's context have rules, the innermost entry
// whose rule encloses wins; without one, the innermost entry with any rule.
const ContextRule kContextRules[] = {
    // Composites: one kforge kernel replaces the whole op, so it owns every kernel inside.
    {"aten-sdpa", op_name,
     "aten::(scaled_dot_product_attention|_scaled_dot_product_(flash|efficient|cudnn)_attention|"
     "_scaled_dot_product_attention_math|_scaled_dot_product_fused_attention_overrideable|"
     "_flash_attention_forward|_efficient_attention_forward|_cudnn_attention_forward)",
     "flash_attention", encloses,
     "scaled-dot-product attention, any backend (the math path's bmm and softmax included)"},
    {"aten-cross-entropy", op_name, "aten::cross_entropy_loss", "cross_entropy", encloses,
     "cross-entropy loss: its log_softmax and nll_loss together"},
    {"aten-layer-norm", op_name, "aten::(layer_norm|native_layer_norm)", "layernorm", encloses,
     "layer norm"},
    {"aten-rms-norm", op_name, "aten::(rms_norm|_fused_rms_norm)", "rmsnorm", encloses, "RMS norm"},
    {"module-rmsnorm", module_class_name, ".*(RMSNorm|RmsNorm|RMSnorm).*", "rmsnorm", encloses,
     "an RMSNorm module: all its kernels (pow, mean, rsqrt, mul in eager mode)"},
    {"module-layernorm", module_class_name, ".*LayerNorm.*", "layernorm", encloses,
     "a LayerNorm module"},
    // Hugging Face's <Model>RotaryEmbedding modules compute the cos/sin tables only; the
    // rotation itself is a function in the attention's forward (fusion.h finds it).
    {"module-rope-tables", module_class_name, "[A-Z][A-Za-z0-9]*[a-z0-9]RotaryEmbedding", "other",
     encloses, "a Hugging Face rotary-embedding module: the cos/sin tables, not the rotation",
     "rope_tables"},
    {"module-rope-half", module_class_name, ".*(Rotary|RoPE|Rope).*Half.*", "rotary_embedding_half",
     encloses, "a rotary-embedding module that rotates halves (x[i], x[i + D/2])"},
    {"module-rope", module_class_name, ".*(Rotary|RoPE|Rope).*", "rotary_embedding", encloses,
     "a rotary-embedding module (interleaved pairs x[2i], x[2i+1])"},
    {"module-mlp", module_class_name, ".*(SwiGLU|SwiGlu|GatedMLP|LlamaMLP).*", "fused_mlp",
     encloses, "a SwiGLU MLP module: its three matmuls and the silu-multiply"},
    {"module-cross-entropy", module_class_name, ".*CrossEntropy.*", "cross_entropy", encloses,
     "a cross-entropy module"},
    {"module-gelu", module_class_name, ".*(GELU|Gelu|GeLU).*", "other", encloses,
     "a GELU activation module (tanh or erf form, one kernel or many)", "gelu"},
    {"aten-embedding", op_name, "aten::(embedding|embedding_bag)", "other", encloses,
     "an embedding lookup", "embedding"},
    {"aten-gelu", op_name, "aten::gelu", "other", innermost, "a GELU activation", "gelu"},
    // Single ops: the innermost decides.
    {"aten-matmul", op_name, "aten::(mm|addmm|bmm|baddbmm|linear|matmul|_addmm_activation)",
     "matmul", innermost, "a matrix product"},
    {"aten-softmax", op_name, "aten::(softmax|_softmax|_safe_softmax)", "softmax", innermost,
     "softmax"},
    {"aten-log-softmax-alone", op_name,
     "aten::(log_softmax|_log_softmax|nll_loss|nll_loss_nd|nll_loss_forward|nll_loss2d|"
     "nll_loss2d_forward)",
     "other", innermost,
     "log_softmax or nll_loss outside a cross-entropy loss: no kforge op computes either alone"},
    {"aten-sum", op_name, "aten::(sum|mean)", "reduce", innermost, "a sum or mean"},
    {"backward", op_name, ".*[Bb]ackward.*", "other", innermost,
     "the backward pass: kforge ops are forward-only (matmuls inside it stay matmuls)"},
};

// Kernel-name rules, tried in order when no context entry has a rule. Earlier rows guard later
// ones: backward before everything, attention before convolution (cuDNN's "flash_fprop"),
// convolution before GEMM (implicit GEMM), log-softmax before softmax.
const KernelNameRule kNameRules[] = {
    {"backward", "backward|bwd|bprop|grad_?input|GammaBeta|fmha_cutlassB|wgrad|dgrad", true,
     "other", "a backward-pass kernel: kforge ops are forward-only"},
    {"flash-attention-2", "flash_fwd", false, "flash_attention",
     "FlashAttention-2 forward (PyTorch's flash backend, flash-attn)"},
    {"flash-attention-3", "FlashAttnFwd|FlashAttentionForward|flash::", false, "flash_attention",
     "FlashAttention-3/4 forward"},
    {"cudnn-sdpa", "sdpa", true, "flash_attention",
     "cuDNN fused attention (cudnn_generated_fort_native_sdpa_*)"},
    {"mem-efficient-attention", "fmha|AttentionKernel", false, "flash_attention",
     "memory-efficient attention (CUTLASS fmha_cutlassF_*, PyTorch's efficient backend)"},
    {"convolution", "convolve|convolution|fprop|implicit_gemm|(^|[^a-z])conv[0-9_]", true, "other",
     "a convolution: no kforge op"},
    {"gemm", "gemm|gemv|nvjet|splitKreduce|cutlass.*(tensorop|simt|wmma)|cublas", true, "matmul",
     "a cuBLAS, cuBLASLt or CUTLASS GEMM (nvjet_*, sm90_xmma_gemm_*, cutlass*gemm*)"},
    {"triton-matmul-template", "^triton_tem_fused_(.*_)?(mm|addmm|bmm|baddbmm)(_|$)", false,
     "matmul", "a matmul template generated by torch.compile"},
    {"triton-layernorm", "^triton_(per|red)_fused_.*(native_layer_norm|var_mean)", false,
     "layernorm", "a layer norm generated by torch.compile"},
    {"triton-rmsnorm", "^triton_(per|red)_fused_.*mean.*rsqrt", false, "rmsnorm",
     "an RMS norm generated by torch.compile (mean of squares, rsqrt)"},
    {"triton-cross-entropy", "^triton_[a-z]+_fused_.*(nll_loss|log_softmax)", false,
     "cross_entropy", "cross-entropy (log_softmax, nll_loss) generated by torch.compile"},
    {"triton-softmax", "^triton_[a-z]+_fused_.*(softmax|amax.*exp.*sum)", false, "softmax",
     "a softmax generated by torch.compile"},
    {"triton-swiglu", "^triton_[a-z]+_fused_.*(mul.*silu|silu.*mul)", false, "fused_mlp",
     "SwiGLU's silu-multiply generated by torch.compile (its matmuls are separate kernels)"},
    {"triton-sum", "^triton_(per|red)_fused_(.*_)?(sum|mean)(_|$)", false, "reduce",
     "a sum or mean generated by torch.compile"},
    {"triton-other", "^triton_", false, "other",
     "other code generated by torch.compile (elementwise, copies)"},
    {"aten-layernorm", "layer_norm|LayerNorm", false, "layernorm",
     "a layer-norm kernel (ATen vectorized_layer_norm_kernel, LayerNormForwardCUDAKernel)"},
    {"rmsnorm-kernel", "rms_?norm", true, "rmsnorm", "an RMS-norm kernel"},
    {"cross-entropy-kernel", "nll_loss_forward|ClassNLLCriterion_updateOutput|cross_?entropy", true,
     "cross_entropy", "an nll_loss or cross-entropy forward kernel"},
    {"aten-log-softmax", "LogSoftMax", false, "cross_entropy",
     "log-softmax: the first half of a cross-entropy loss"},
    {"aten-log-softmax-warp", "softmax_warp_forward<", false, "cross_entropy",
     "softmax_warp_forward with is_log_softmax set: the first half of a cross-entropy loss",
     &is_log_softmax_warp},
    {"softmax-kernel", "softmax", true, "softmax",
     "a softmax kernel (ATen cunn_SoftMaxForward, softmax_warp_forward)"},
    {"aten-sum", "reduce_kernel<.*(sum_functor|MeanOps)", false, "reduce",
     "ATen's sum or mean reduction"},
    {"rotary-kernel", "rotary|(^|[^a-z])rope", true, "rotary_embedding",
     "a rotary-embedding kernel"},
    {"swiglu-kernel", "silu_and_mul|act_and_mul|swiglu", true, "fused_mlp",
     "a fused silu-multiply (SwiGLU activation)"},
    {"aten-other-reduction", "reduce_kernel", false, "other",
     "a reduction other than sum or mean (max, argmax, norm)"},
    {"elementwise", "elementwise|copy|fill|cat|index|scatter|gather", true, "other",
     "elementwise, copy or indexing"},
};

const std::vector<std::regex>& context_patterns() {
  static const std::vector<std::regex> patterns = [] {
    std::vector<std::regex> out;
    for (const auto& rule : kContextRules)
      out.emplace_back(std::string(rule.pattern), std::regex::ECMAScript | std::regex::optimize);
    return out;
  }();
  return patterns;
}

const std::vector<std::regex>& name_patterns() {
  static const std::vector<std::regex> patterns = [] {
    std::vector<std::regex> out;
    for (const auto& rule : kNameRules) {
      auto flags = std::regex::ECMAScript | std::regex::optimize;
      if (rule.ignore_case) flags |= std::regex::icase;
      out.emplace_back(std::string(rule.pattern), flags);
    }
    return out;
  }();
  return patterns;
}

bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

}  // namespace

std::string_view evidence_name(Evidence evidence) {
  switch (evidence) {
    case Evidence::context_op:
      return "context op";
    case Evidence::module:
      return "module";
    case Evidence::kernel_name:
      return "kernel name";
  }
  return "?";
}

std::span<const ContextRule> context_rules() {
  return kContextRules;
}

std::span<const KernelNameRule> kernel_name_rules() {
  return kNameRules;
}

std::string module_class(std::string_view op_name) {
  std::string_view rest;
  bool numbered = false;
  if (op_name.starts_with("module::")) {
    rest = op_name.substr(8);
  } else if (op_name.starts_with("nn.Module: ")) {
    rest = op_name.substr(11);
    numbered = true;  // torch.profiler appends the instance number: "LlamaMLP_0"
  } else {
    return "";
  }
  rest = rest.substr(0, rest.find(','));
  while (!rest.empty() && rest.back() == ' ')
    rest.remove_suffix(1);
  if (numbered) {
    const size_t underscore = rest.rfind('_');
    if (underscore != std::string_view::npos && underscore + 1 < rest.size() &&
        std::all_of(rest.begin() + static_cast<std::ptrdiff_t>(underscore) + 1, rest.end(),
                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      rest = rest.substr(0, underscore);
  }
  return std::string(rest);
}

std::optional<DType> dtype_from_kernel_name(std::string_view name) {
  // Sixteen-bit names first: their kernels often name float as the accumulator type too.
  for (const char* marker : {"bfloat16", "BFloat16", "bf16"}) {
    if (contains(name, marker)) return DType::bf16;
  }
  // cuDNN's generated kernels say "f16" for either 16-bit type (a bf16 SDPA on an H200 ran
  // cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_...): no dtype from them.
  if (name.starts_with("cudnn_generated")) return std::nullopt;
  for (const char* marker : {"c10::Half", "__half", "half_t", "fp16", "f16"}) {
    if (contains(name, marker)) return DType::f16;
  }
  for (const char* marker : {"<float", "(float", "sgemm", "f32f32", "_f32_"}) {
    if (contains(name, marker)) return DType::f32;
  }
  return std::nullopt;
}

std::optional<bool> causal_from_kernel_name(std::string_view name) {
  if (const auto args = template_args(name, "flash_fwd_splitkv_kernel<"); args && args->size() > 1)
    return flag_arg((*args)[1]);
  if (const auto args = template_args(name, "flash_fwd_kernel<"); args && args->size() > 2)
    return flag_arg((*args)[2]);
  return std::nullopt;
}

std::string short_kernel_name(std::string_view name) {
  std::string s(name);
  if (s.starts_with("void ")) s.erase(0, 5);
  for (const std::string_view noise : {"(anonymous namespace)::", "<unnamed>::"}) {
    for (size_t at = s.find(noise); at != std::string::npos; at = s.find(noise))
      s.erase(at, noise.size());
  }
  const size_t open = s.find_first_of("<(");
  std::string base = s.substr(0, open);
  if (const size_t colon = base.rfind("::"); colon != std::string::npos) base.erase(0, colon + 2);
  // Launch wrappers: the interesting name is their first template argument.
  if (open != std::string::npos && s[open] == '<' &&
      (base == "Kernel" || base == "Kernel2" || base == "device_kernel" ||
       base == "enable_sm90_or_later" || base == "enable_sm80_to_sm89")) {
    const auto args = template_args(s, base + "<");
    if (args && !args->empty()) return short_kernel_name(args->front());
  }
  return base.empty() ? std::string(name) : base;
}

KernelClassifier::KernelClassifier(ClassifyOptions options) : options_(options) {}

const ContextRule* KernelClassifier::rule_for(const ContextOp& op) {
  const auto found = context_memo_.find(op.name);
  if (found != context_memo_.end()) return found->second;
  const std::string cls = module_class(op.name);
  const ContextRule* match = nullptr;
  const auto& patterns = context_patterns();
  for (size_t i = 0; i < std::size(kContextRules) && !match; ++i) {
    const ContextRule& rule = kContextRules[i];
    if (rule.target == RuleTarget::module_class) {
      if (!cls.empty() && std::regex_match(cls, patterns[i])) match = &rule;
    } else if (cls.empty() && std::regex_match(op.name, patterns[i])) {
      match = &rule;
    }
  }
  context_memo_.emplace(op.name, match);
  return match;
}

const Classification& KernelClassifier::by_name(std::string_view name) {
  const std::string key(name);
  const auto found = name_memo_.find(key);
  if (found != name_memo_.end()) return found->second;
  Classification c{"other", "unmatched", "no rule matched", Evidence::kernel_name, -1};
  const auto& patterns = name_patterns();
  for (size_t i = 0; i < std::size(kNameRules); ++i) {
    const KernelNameRule& rule = kNameRules[i];
    if (!std::regex_search(key, patterns[i])) continue;
    if (rule.also && !rule.also(name)) continue;
    c = {std::string(rule.op), std::string(rule.id), std::string(rule.why), Evidence::kernel_name,
         -1};
    break;
  }
  return name_memo_.emplace(key, std::move(c)).first->second;
}

Classification KernelClassifier::classify(std::string_view kernel_name,
                                          std::span<const ContextOp> context) {
  std::vector<const ContextOp*> pointers;
  for (const auto& op : context)
    pointers.push_back(&op);
  return classify(kernel_name, pointers);
}

Classification KernelClassifier::classify(std::string_view kernel_name,
                                          std::span<const ContextOp* const> context) {
  const int n = static_cast<int>(context.size());
  std::vector<const ContextRule*> rules(context.size());
  for (int i = 0; i < n; ++i)
    rules[i] = rule_for(*context[i]);
  const auto decided_by = [&](int i) {
    const ContextRule& rule = *rules[i];
    return Classification{
        std::string(rule.op),
        std::string(rule.id),
        std::string(rule.why),
        module_class(context[i]->name).empty() ? Evidence::context_op : Evidence::module,
        i,
        std::string(rule.group),
        rule.scope == RuleScope::encloses};
  };
  for (int i = n - 1; i >= 0; --i) {
    if (!rules[i] || rules[i]->scope != RuleScope::encloses) continue;
    if (options_.split_mlp && rules[i]->op == "fused_mlp") {
      for (int j = n - 1; j > i; --j) {
        if (rules[j] && rules[j]->op == "matmul") return decided_by(j);
      }
      const Classification& named = by_name(kernel_name);
      if (named.op == "matmul") return named;
      return {"other", "mlp-split", "the rest of an MLP module whose matmuls count apart",
              Evidence::module, i};
    }
    return decided_by(i);
  }
  for (int i = n - 1; i >= 0; --i) {
    if (!rules[i]) continue;
    // A chain of ops of one rule is one call: aten::matmul -> aten::bmm launches a copy under
    // aten::matmul and a GEMM under aten::bmm; both belong to the aten::matmul call.
    while (i > 0 && rules[i - 1] == rules[i])
      --i;
    return decided_by(i);
  }
  return by_name(kernel_name);
}

}  // namespace kforge
