#include "profile/op_shapes.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kforge {
namespace {

using Dims = std::vector<int64_t>;

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

// Splits at commas outside brackets and parentheses.
std::vector<std::string_view> split_top_level(std::string_view text) {
  std::vector<std::string_view> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '[' || c == '(') ++depth;
    if ((c == ']' || c == ')') && depth > 0) --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(trim(text.substr(start, i - start)));
      start = i + 1;
    }
  }
  parts.push_back(trim(text.substr(start)));
  return parts;
}

// "[[8, 512], [512], []]" -> {{8, 512}, {512}, {}}; nullopt when malformed.
std::optional<std::vector<Dims>> parse_size_lists(std::string_view text) {
  text = trim(text);
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return std::nullopt;
  text = trim(text.substr(1, text.size() - 2));
  std::vector<Dims> lists;
  if (text.empty()) return lists;
  for (const std::string_view item : split_top_level(text)) {
    if (item.size() < 2 || item.front() != '[' || item.back() != ']') return std::nullopt;
    const std::string_view inner = trim(item.substr(1, item.size() - 2));
    Dims dims;
    if (!inner.empty()) {
      for (const std::string_view number : split_top_level(inner)) {
        int64_t value = 0;
        const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
        if (ec != std::errc() || end != number.data() + number.size()) return std::nullopt;
        dims.push_back(value);
      }
    }
    lists.push_back(std::move(dims));
  }
  return lists;
}

int64_t product(const Dims& dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < dims.size(); ++i)
    p *= dims[i];
  return p;
}

// Product of all dims but the last (1 for a vector): the rows of a row-wise op.
int64_t leading(const Dims& dims) {
  return dims.empty() ? 1 : product(dims, 0, dims.size() - 1);
}

std::string dims_text(const Dims& dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

// The dims of input i, or an empty list when it was not recorded.
const Dims& input(const std::vector<Dims>& inputs, size_t i) {
  static const Dims none;
  return i < inputs.size() ? inputs[i] : none;
}

// Builds the problem of one op from its inputs; returns the reason on failure.
class Mapper {
 public:
  Mapper(std::string_view op, const ContextOp& context, const ShapeHints& hints)
      : op_(op), context_(context), hints_(hints), in_(context.input_dims) {
    name_ = context.name;
    if (name_.starts_with("aten::")) name_.remove_prefix(6);
    is_module_ = context.name.starts_with("module::") || context.name.starts_with("nn.Module: ");
  }

  std::optional<MappedProblem> map(std::string* why_not) {
    problem_.op = std::string(op_);
    const bool ok = in_.empty() ? fail("no input shapes recorded") : dispatch();
    if (!ok) {
      if (why_not) *why_not = why_;
      return std::nullopt;
    }
    // Positional sizes must be positive; named ones (causal = 0) need not.
    for (const auto& size : find_op(op_)->size_names()) {
      const auto it = problem_.sizes.find(size);
      if (it != problem_.sizes.end() && it->second <= 0) {
        if (why_not) *why_not = fmt::format("size {} = {} is not positive", size, it->second);
        return std::nullopt;
      }
    }
    if (main_input_ < context_.input_types.size())
      problem_.dtype = dtype_from_torch_type(context_.input_types[main_input_]);
    return problem_;
  }

 private:
  bool dispatch() {
    if (op_ == "matmul") return matmul();
    if (op_ == "softmax") return rows_by_last_dim("rows", "cols");
    if (op_ == "reduce") return rows_by_last_dim("M", "N");
    if (op_ == "layernorm") return normalization("batch", "dim");
    if (op_ == "rmsnorm") return normalization("M", "N");
    if (op_ == "cross_entropy") return cross_entropy();
    if (op_ == "flash_attention") return attention();
    if (op_ == "rotary_embedding" || op_ == "rotary_embedding_half") return rotary();
    if (op_ == "fused_mlp") return mlp();
    return fail(fmt::format("no shape rule for op '{}'", op_));
  }

  bool fail(std::string why) {
    why_ = std::move(why);
    return false;
  }
  void note(std::string text) { problem_.notes.push_back(std::move(text)); }
  void set(const char* name, int64_t value) { problem_.sizes[name] = value; }

  bool matmul() {
    const auto mnk = [&](int64_t m, int64_t n, int64_t k) {
      set("M", m);
      set("N", n);
      set("K", k);
      return true;
    };
    // [M, K] @ [K, N] from inputs a and b.
    const auto plain = [&](size_t a, size_t b) {
      const Dims &x = input(in_, a), &y = input(in_, b);
      if (x.size() != 2 || y.size() != 2 || x[1] != y[0]) return false;
      main_input_ = a;
      return mnk(x[0], y[1], x[1]);
    };
    // [B, M, K] @ [B, K, N]: the batch folds into M for the cost.
    const auto batched = [&](size_t a, size_t b) {
      const Dims &x = input(in_, a), &y = input(in_, b);
      if (x.size() != 3 || y.size() != 3 || x[2] != y[1] || x[0] != y[0]) return false;
      main_input_ = a;
      note(fmt::format("batch {} folded into M (a batched matmul costed as one)", x[0]));
      return mnk(x[0] * x[1], y[2], x[2]);
    };
    if (name_ == "mm") {
      if (plain(0, 1)) return true;
      return fail(fmt::format("mm inputs {} and {} are not [M, K] and [K, N]",
                              dims_text(input(in_, 0)), dims_text(input(in_, 1))));
    }
    if (name_ == "addmm") {
      // addmm(input, mat1, mat2, ...): input + mat1 @ mat2, the input first.
      if (plain(1, 2)) {
        add_term(input(in_, 0));
        return true;
      }
      if (plain(0, 1)) return true;
      return fail("addmm inputs are not input, [M, K], [K, N]");
    }
    if (name_ == "_addmm_activation") {
      // An activation after the bias: no kforge op computes it, so the matmul is the problem.
      if (plain(1, 2) || plain(0, 1)) {
        note("its bias and activation are left out (no kforge op adds an activation)");
        return true;
      }
      return fail("addmm inputs are not bias, [M, K], [K, N]");
    }
    if (name_ == "bmm") {
      if (batched(0, 1)) return true;
      return fail("bmm inputs are not [B, M, K] and [B, K, N]");
    }
    if (name_ == "baddbmm") {
      if (batched(1, 2)) return true;
      return fail("baddbmm inputs are not bias, [B, M, K], [B, K, N]");
    }
    if (name_ == "linear") {
      // linear(x [.., K], weight [N, K], bias [N]): y = x weight^T.
      const Dims &x = input(in_, 0), &w = input(in_, 1);
      if (x.empty() || w.size() != 2 || x.back() != w[1])
        return fail(fmt::format("linear inputs {} and {} are not [.., K] and [N, K]", dims_text(x),
                                dims_text(w)));
      mnk(leading(x), w[0], w[1]);
      add_term(input(in_, 2));
      return true;
    }
    if (name_ == "matmul") {
      const Dims &x = input(in_, 0), &y = input(in_, 1);
      if (x.empty() || y.empty()) return fail("matmul inputs not recorded");
      const int64_t k = x.back();
      if (y.size() == 1) {  // matrix-vector
        if (y[0] != k) return fail("matmul inner dims differ");
        return mnk(leading(x), 1, k);
      }
      if (y[y.size() - 2] != k) return fail("matmul inner dims differ");
      // The batch dims (all but the last two) broadcast against each other, as torch.matmul
      // does: [M, K] @ [B, K, N] is B products.
      const Dims xb(x.begin(), x.end() - std::min<std::ptrdiff_t>(2, std::ssize(x)));
      const Dims yb(y.begin(), y.end() - 2);
      int64_t batch = 1;
      for (size_t i = 0; i < std::max(xb.size(), yb.size()); ++i) {
        const int64_t a = i < xb.size() ? xb[xb.size() - 1 - i] : 1;
        const int64_t b = i < yb.size() ? yb[yb.size() - 1 - i] : 1;
        if (a != b && a != 1 && b != 1)
          return fail(fmt::format("matmul batch dims {} and {} do not broadcast", dims_text(xb),
                                  dims_text(yb)));
        batch *= std::max(a, b);
      }
      if (!yb.empty())
        note(fmt::format("batch {} folded into M (a batched matmul costed as one)", batch));
      const int64_t rows = x.size() == 1 ? 1 : x[x.size() - 2];
      return mnk(batch * rows, y.back(), k);
    }
    return fail(fmt::format("no matmul shape rule for '{}'", context_.name));
  }

  // The term a matmul's call adds to its product (M, N set): none, a bias [N] broadcast over the
  // rows (matmul_bias), or a whole [M, N] (matmul_residual). Anything else (a column, a scalar)
  // leaves the matmul as the problem, with a note.
  void add_term(const Dims& term) {
    if (term.empty()) return;
    const int64_t m = problem_.sizes.at("M"), n = problem_.sizes.at("N");
    if (term == Dims{n} || term == Dims{1, n}) {
      problem_.op = "matmul_bias";
    } else if (term == Dims{m, n}) {
      problem_.op = "matmul_residual";
    } else {
      note(
          fmt::format("the added {} is left out (neither a bias [N] nor [M, N])", dims_text(term)));
    }
  }

  // rows = product of the leading dims, cols = the last one.
  bool rows_by_last_dim(const char* rows, const char* cols) {
    const Dims& x = input(in_, 0);
    if (x.empty()) return fail("no input tensor recorded");
    set(rows, leading(x));
    set(cols, x.back());
    note("reduction dim not recorded: taken as the last");
    return true;
  }

  // Normalized over the weight's dims (the last dims of x); rows over the rest.
  bool normalization(const char* rows, const char* cols) {
    const Dims& x = input(in_, 0);
    if (x.empty()) return fail("no input tensor recorded");
    // aten::layer_norm / native_layer_norm / rms_norm(input, normalized_shape, weight, ...); a
    // module range lists (x, weight, ...).
    const Dims& w = input(in_, is_module_ ? 1 : 2);
    int64_t dim = x.back();
    if (!w.empty()) {
      if (w.size() > x.size() ||
          !std::equal(w.begin(), w.end(), x.end() - static_cast<std::ptrdiff_t>(w.size())))
        return fail(
            fmt::format("weight {} is not the trailing dims of {}", dims_text(w), dims_text(x)));
      dim = product(w, 0, w.size());
    } else {
      note("no weight recorded: normalized over the last dim");
    }
    set(rows, product(x, 0, x.size()) / dim);
    set(cols, dim);
    return true;
  }

  bool cross_entropy() {
    const Dims& logits = input(in_, 0);
    if (logits.empty() || logits.size() > 2)
      return fail(fmt::format("logits {} are not [batch, vocab]", dims_text(logits)));
    set("batch", logits.size() == 1 ? 1 : logits[0]);
    set("vocab", logits.back());
    if (!input(in_, 2).empty()) note("class weights given: the cost model ignores them");
    return true;
  }

  bool attention() {
    // ATen's SDPA entry points take [B, H, S, D]; the flash and memory-efficient forwards
    // underneath take [B, S, H, D].
    const bool seq_major =
        name_ == "_flash_attention_forward" || name_ == "_efficient_attention_forward";
    const Dims &q = input(in_, 0), &k = input(in_, 1), &v = input(in_, 2);
    if (q.size() != 4 || k.size() != 4 || v.size() != 4)
      return fail(fmt::format("query/key/value {} {} {} are not 4-d", dims_text(q), dims_text(k),
                              dims_text(v)));
    const auto bhsd = [&](const Dims& t) { return seq_major ? Dims{t[0], t[2], t[1], t[3]} : t; };
    const Dims Q = bhsd(q), K = bhsd(k), V = bhsd(v);
    if (K[2] != Q[2])
      return fail(
          fmt::format("query length {} differs from key length {}: the kforge op has one "
                      "seq_len",
                      Q[2], K[2]));
    if (K[3] != Q[3] || V[3] != Q[3]) return fail("query, key and value head dims differ");
    if (K[1] != Q[1]) {
      note(fmt::format("key/value have {} heads, query {} (grouped-query): costed as {}", K[1],
                       Q[1], Q[1]));
    }
    set("batch", Q[0]);
    set("heads", Q[1]);
    set("seq_len", Q[2]);
    set("head_dim", Q[3]);
    if (!seq_major && !input(in_, 3).empty()) note("attention mask given: costed without it");
    std::optional<bool> causal = hints_.causal;
    for (const char* key : {"is_causal", "causal"}) {
      if (!causal && context_.fields.contains(key))
        causal = parse_flag(context_.fields.find(key)->second);
    }
    if (!causal) note("causal not recorded: assumed non-causal");
    set("causal", causal.value_or(false) ? 1 : 0);
    return true;
  }

  bool rotary() {
    // module::RotaryEmbedding(x [B, H, S, D], cos [S, D/2], sin [S, D/2]).
    const Dims &x = input(in_, 0), &cos = input(in_, 1);
    if (x.size() != 4) return fail(fmt::format("x {} is not 4-d", dims_text(x)));
    const int64_t b = x[0], d = x[3];
    int64_t h = x[1], s = x[2];
    if (d % 2 != 0) return fail(fmt::format("head_dim {} is odd", d));
    if (cos.size() == 2) {
      if (x[2] != cos[0] && x[1] == cos[0]) {
        h = x[2];
        s = x[1];
        note("x is [batch, seq_len, heads, head_dim]");
      } else if (x[2] != cos[0]) {
        return fail(
            fmt::format("cos {} matches no sequence dim of x {}", dims_text(cos), dims_text(x)));
      }
      if (cos[1] == d) {
        note("cos/sin hold head_dim values per position: costed as head_dim / 2");
      } else if (cos[1] != d / 2) {
        return fail(
            fmt::format("cos {} is neither [S, D/2] nor [S, D] for D = {}", dims_text(cos), d));
      }
    } else {
      note("no cos/sin recorded: x taken as [batch, heads, seq_len, head_dim]");
    }
    set("batch", b);
    set("heads", h);
    set("seq_len", s);
    set("head_dim", d);
    return true;
  }

  bool mlp() {
    // module::SwiGLU(x [.., D], w_gate [H, D], w_up [H, D], w_down [D, H]).
    const Dims &x = input(in_, 0), &gate = input(in_, 1), &down = input(in_, 3);
    if (x.empty()) return fail("no input tensor recorded");
    const int64_t d = x.back();
    if (gate.size() != 2 || gate[1] != d)
      return fail(gate.empty() ? std::string("hidden size not recorded (no weights in the range)")
                               : fmt::format("w_gate {} is not [H, {}]", dims_text(gate), d));
    if (!down.empty() && (down.size() != 2 || down[0] != d || down[1] != gate[0]))
      return fail(fmt::format("w_down {} is not [{}, {}]", dims_text(down), d, gate[0]));
    set("batch", leading(x));
    set("dim", d);
    set("hidden", gate[0]);
    return true;
  }

  std::string_view op_;
  const ContextOp& context_;
  const ShapeHints& hints_;
  const std::vector<Dims>& in_;
  std::string_view name_;
  bool is_module_ = false;
  size_t main_input_ = 0;
  MappedProblem problem_;
  std::string why_;
};

// Scalar arguments worth a field, by their position in the op's schema: a torch.profiler trace
// records them positionally ("Concrete Inputs"), NVTX ranges not at all.
struct NamedArgument {
  std::string_view op;
  size_t index;
  std::string_view field;
};
constexpr NamedArgument kNamedArguments[] = {
    // (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    {"aten::scaled_dot_product_attention", 5, "is_causal"},
    // (query, key, value, dropout_p, is_causal, return_debug_mask, scale)
    {"aten::_scaled_dot_product_flash_attention", 4, "is_causal"},
    // (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, ...)
    {"aten::_scaled_dot_product_efficient_attention", 6, "is_causal"},
    {"aten::_scaled_dot_product_cudnn_attention", 6, "is_causal"},
    // (query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, ...)
    {"aten::_flash_attention_forward", 8, "is_causal"},
    // (query, key, value, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, compute_log_sumexp,
    //  dropout_p, is_causal, ...)
    {"aten::_cudnn_attention_forward", 10, "is_causal"},
};

}  // namespace

std::optional<bool> parse_flag(std::string_view value) {
  value = trim(value);
  if (value == "1" || value == "True" || value == "true") return true;
  if (value == "0" || value == "False" || value == "false") return false;
  return std::nullopt;
}

ContextOp parse_context(const OpContext& context) {
  ContextOp op;
  op.text = context.name;
  op.input_dims = context.input_dims;
  op.input_types = context.input_types;
  const auto parts = split_top_level(context.name);
  // An op text is "NAME" followed by "key = value" items only; anything else is a plain name.
  std::vector<std::pair<std::string_view, std::string_view>> items;
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    if (eq == std::string_view::npos || eq == 0) {
      op.name = std::string(trim(context.name));
      return op;
    }
    items.emplace_back(trim(parts[i].substr(0, eq)), trim(parts[i].substr(eq + 1)));
  }
  op.name = std::string(parts.front());
  op.identifies_call = context.call != 0;
  for (const auto& [key, value] : items) {
    if (key == "sizes") {
      if (auto dims = parse_size_lists(value); dims && op.input_dims.empty())
        op.input_dims = std::move(*dims);
    } else if (key == "types") {
      // kforge's module ranges (profile --torch) name each operand's dtype.
      if (value.size() >= 2 && value.front() == '[' && value.back() == ']' &&
          op.input_types.empty()) {
        for (const std::string_view type : split_top_level(value.substr(1, value.size() - 2)))
          op.input_types.emplace_back(type);
      }
    } else if (key == "input_op_ids") {
      // Graph edges between ops; not needed here.
    } else {
      if (key == "seq" || key == "op_id") op.identifies_call = true;
      op.fields.emplace(std::string(key), std::string(value));
    }
  }
  for (const NamedArgument& arg : kNamedArguments) {
    if (op.name == arg.op && arg.index < context.input_values.size() &&
        !context.input_values[arg.index].empty())
      op.fields.emplace(std::string(arg.field), context.input_values[arg.index]);
  }
  return op;
}

std::optional<DType> dtype_from_torch_type(std::string_view type) {
  if (type == "c10::BFloat16" || type == "BFloat16" || type == "torch.bfloat16") return DType::bf16;
  if (type == "c10::Half" || type == "Half" || type == "torch.float16") return DType::f16;
  if (type == "float" || type == "torch.float32") return DType::f32;
  if (type == "double" || type == "torch.float64") return DType::f64;
  return std::nullopt;
}

std::optional<MappedProblem> map_problem(std::string_view op, const ContextOp& context,
                                         const ShapeHints& hints, std::string* why_not) {
  const OpSpec* spec = find_op(op);
  if (!spec) {
    if (why_not) *why_not = fmt::format("'{}' is not a kforge op", op);
    return std::nullopt;
  }
  auto problem = Mapper(op, context, hints).map(why_not);
  if (problem) spec->complete_sizes(problem->sizes);
  return problem;
}

}  // namespace kforge
