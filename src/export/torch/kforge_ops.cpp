// kforge's PyTorch extension: one custom op per kforge op (torch.ops.kforge.rmsnorm, ...), each
// running the compiled modules a `kforge export --target torch` chose for its sizes: the same
// shared objects kforge checked and timed, loaded with dlopen, called through the kernel ABI
// (kforge/kernel.h) on PyTorch's current stream.
//
// A call runs a kforge module when its tensors are covered: CUDA, contiguous, on a GPU of the
// model the export was tuned for, in an exported dtype, at exported sizes (the dispatch key:
// the op's sizes read from the input shapes, leading dimensions folded into the first, as in
// docs/export.md). Anything else runs the ATen composite below, and every call is counted
// under "kforge" or the reason it fell back (stats()). A module that refuses the tensors
// (KF_ERR_UNSUPPORTED) has launched nothing, so its call falls back too; any other failure is
// an error. Nothing is allocated per call but the outputs, nothing is synchronized, so the ops
// can be captured in CUDA graphs (after a warm-up call, as PyTorch asks of any op).
//
// The tables are filled once at import by the package (kforge_ops/__init__.py) from its
// manifest; calls only read them.
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "kforge/kernel.h"

namespace {

using Entry = int (*)(const kf_args*);

// Where one size of the dispatch key is read: input `input`'s dimension `dim` of `rank`.
struct DimSource {
  int64_t input;
  int64_t dim;
  int64_t rank;
};

struct Row {
  Entry run = nullptr;
  std::string variant;
};

struct OpTable {
  std::vector<DimSource> key;
  std::map<std::pair<int, std::vector<int64_t>>, Row> rows;  // (kf_dtype, sizes) -> module
};

std::map<std::string, OpTable>& tables() {
  static std::map<std::string, OpTable> t;
  return t;
}

std::string& exported_device_name() {
  static std::string name;
  return name;
}

std::mutex& stats_mutex() {
  static std::mutex m;
  return m;
}

std::map<std::string, std::map<std::string, int64_t>>& stats_table() {
  static std::map<std::string, std::map<std::string, int64_t>> s;
  return s;
}

void count(const std::string& op, const std::string& what) {
  std::lock_guard<std::mutex> lock(stats_mutex());
  ++stats_table()[op][what];
}

// The kf_dtype of a tensor, or -1 for one the ABI has no name for.
int abi_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf:
      return KF_DTYPE_F16;
    case at::kBFloat16:
      return KF_DTYPE_BF16;
    case at::kFloat:
      return KF_DTYPE_F32;
    case at::kDouble:
      return KF_DTYPE_F64;
    case at::kInt:
      return KF_DTYPE_I32;
    case at::kLong:
      return KF_DTYPE_I64;
    default:
      return -1;
  }
}

// Whether device `index` is the GPU model the export was tuned for (asked once per device).
bool exported_device(int index) {
  static std::mutex m;
  static std::map<int, bool> known;
  std::lock_guard<std::mutex> lock(m);
  const auto it = known.find(index);
  if (it != known.end()) return it->second;
  const bool same = exported_device_name() == at::cuda::getDeviceProperties(index)->name;
  known[index] = same;
  return same;
}

// The row that covers `inputs`, or null with `why` set.
const Row* covering_row(const std::string& op, const std::vector<at::Tensor>& inputs,
                        std::string& why) {
  const auto table = tables().find(op);
  if (table == tables().end()) {
    why = "op not exported";
    return nullptr;
  }
  const at::Tensor& first = inputs.front();
  for (const at::Tensor& t : inputs) {
    if (!t.is_cuda() || t.device() != first.device()) {
      why = "device: not all tensors on one CUDA device";
      return nullptr;
    }
    if (!t.is_contiguous()) {
      why = "layout: a tensor is not contiguous";
      return nullptr;
    }
    if (t.dim() > KF_MAX_DIMS || abi_dtype(t) < 0) {
      why = "layout: more dimensions or a dtype the kernel ABI does not take";
      return nullptr;
    }
  }
  if (!exported_device(first.device().index())) {
    why = "device: not the GPU model the export was tuned for";
    return nullptr;
  }
  std::vector<int64_t> sizes;
  for (const DimSource& d : table->second.key) {
    const at::Tensor& t = inputs.at(d.input);
    const int64_t extra = t.dim() - d.rank;
    if (extra < 0) {
      why = "shape: fewer dimensions than the op's";
      return nullptr;
    }
    int64_t value = 1;
    if (d.dim == 0) {
      for (int64_t i = 0; i <= extra; ++i)
        value *= t.size(i);
    } else {
      value = t.size(extra + d.dim);
    }
    sizes.push_back(value);
  }
  const auto row = table->second.rows.find({abi_dtype(first), sizes});
  if (row == table->second.rows.end()) {
    const bool dtype_known =
        std::any_of(table->second.rows.begin(), table->second.rows.end(),
                    [&](const auto& r) { return r.first.first == abi_dtype(first); });
    why = dtype_known ? "shape: sizes not exported" : "dtype: not exported";
    return nullptr;
  }
  return &row->second;
}

kf_tensor abi_tensor(const at::Tensor& t) {
  kf_tensor out{};
  out.data = t.data_ptr();
  out.dtype = static_cast<kf_dtype>(abi_dtype(t));
  out.ndim = static_cast<int32_t>(t.dim());
  for (int64_t i = 0; i < t.dim(); ++i) {
    out.shape[i] = t.size(i);
    out.stride[i] = t.stride(i);
  }
  return out;
}

// Runs `row`'s module. False when the module refused the tensors (it launched nothing).
bool launch(const std::string& op, const Row& row, const std::vector<at::Tensor>& inputs,
            const std::vector<at::Tensor>& outputs, const std::vector<double>& scalars) {
  std::vector<kf_tensor> in;
  std::vector<kf_tensor> out;
  for (const at::Tensor& t : inputs)
    in.push_back(abi_tensor(t));
  for (const at::Tensor& t : outputs)
    out.push_back(abi_tensor(t));
  const c10::cuda::CUDAGuard guard(inputs.front().device());
  kf_args args{};
  args.abi_version = KFORGE_ABI_VERSION;
  args.num_inputs = static_cast<int32_t>(in.size());
  args.inputs = in.data();
  args.num_outputs = static_cast<int32_t>(out.size());
  args.outputs = out.data();
  args.num_scalars = static_cast<int32_t>(scalars.size());
  args.scalars = scalars.data();
  args.stream = at::cuda::getCurrentCUDAStream(inputs.front().device().index()).stream();
  const int status = row.run(&args);
  if (status == KF_ERR_UNSUPPORTED) return false;
  TORCH_CHECK(status == KF_OK, "kforge::", op, ": variant ", row.variant, " failed with status ",
              status);
  return true;
}

// Runs `op` through its exported module into outputs made by `make_outputs`, or returns an
// empty vector (counted with the reason) for the caller's ATen composite.
template <typename MakeOutputs>
std::vector<at::Tensor> try_kforge(const std::string& op, const std::vector<at::Tensor>& inputs,
                                   const std::vector<double>& scalars, MakeOutputs make_outputs) {
  std::string why;
  const Row* row = covering_row(op, inputs, why);
  if (row != nullptr) {
    std::vector<at::Tensor> outputs = make_outputs();
    if (launch(op, *row, inputs, outputs, scalars)) {
      count(op, "kforge");
      return outputs;
    }
    why = "the variant refused these tensors";
  }
  count(op, why);
  return {};
}

// ---- The ops, each with its ATen composite ----

at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto out =
      try_kforge("rmsnorm", {x, weight}, {eps}, [&] { return std::vector{at::empty_like(x)}; });
  if (!out.empty()) return out[0];
  const at::Tensor xf = x.to(at::kFloat);
  return (xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps) * weight.to(at::kFloat))
      .to(x.scalar_type());
}

at::Tensor layernorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     double eps) {
  auto out = try_kforge("layernorm", {x, weight, bias}, {eps},
                        [&] { return std::vector{at::empty_like(x)}; });
  if (!out.empty()) return out[0];
  return at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
}

at::Tensor softmax(const at::Tensor& x) {
  auto out = try_kforge("softmax", {x}, {}, [&] { return std::vector{at::empty_like(x)}; });
  if (!out.empty()) return out[0];
  return at::softmax(x, -1);
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  auto out = try_kforge("cross_entropy", {logits, targets}, {},
                        [&] { return std::vector{at::empty({}, logits.options())}; });
  if (!out.empty()) return out[0];
  return at::cross_entropy_loss(logits.to(at::kFloat), targets, {}, at::Reduction::Mean, -100)
      .to(logits.scalar_type());
}

// cos and sin: [seq_len, head_dim / 2]; x: [batch, heads, seq_len, head_dim].
at::Tensor rotary_embedding_half(const at::Tensor& x, const at::Tensor& cos,
                                 const at::Tensor& sin) {
  auto out = try_kforge("rotary_embedding_half", {x, cos, sin}, {},
                        [&] { return std::vector{at::empty_like(x)}; });
  if (!out.empty()) return out[0];
  const int64_t half = x.size(-1) / 2;
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor a = xf.narrow(-1, 0, half);
  const at::Tensor b = xf.narrow(-1, half, half);
  const at::Tensor c = cos.to(at::kFloat);
  const at::Tensor s = sin.to(at::kFloat);
  return at::cat({a * c - b * s, a * s + b * c}, -1).to(x.scalar_type());
}

// Pairs (x[2i], x[2i + 1]).
at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  auto out = try_kforge("rotary_embedding", {x, cos, sin}, {},
                        [&] { return std::vector{at::empty_like(x)}; });
  if (!out.empty()) return out[0];
  auto shape = x.sizes().vec();
  shape.back() /= 2;
  shape.push_back(2);
  const at::Tensor pairs = x.to(at::kFloat).reshape(shape);
  const at::Tensor a = pairs.select(-1, 0);
  const at::Tensor b = pairs.select(-1, 1);
  const at::Tensor c = cos.to(at::kFloat);
  const at::Tensor s = sin.to(at::kFloat);
  return at::stack({a * c - b * s, a * s + b * c}, -1).reshape(x.sizes()).to(x.scalar_type());
}

at::Tensor reduce(const at::Tensor& x) {
  auto out = try_kforge("reduce", {x}, {}, [&] {
    auto shape = x.sizes().vec();
    shape.pop_back();
    return std::vector{at::empty(shape, x.options())};
  });
  if (!out.empty()) return out[0];
  return x.to(at::kFloat).sum(-1).to(x.scalar_type());
}

// ---- Set-up and statistics, called from Python ----

void set_device(const std::string& name) {
  exported_device_name() = name;
}

void add_op(const std::string& op, const std::vector<std::vector<int64_t>>& key) {
  OpTable& table = tables()[op];
  table.key.clear();
  for (const auto& d : key) {
    TORCH_CHECK(d.size() == 3, "a dispatch key entry is (input, dim, rank)");
    table.key.push_back({d[0], d[1], d[2]});
  }
}

// Loads `module` (a kforge module: a shared object with the kforge_run entry point) and routes
// calls of `op` in `dtype` at `sizes` to it.
void add_row(const std::string& op, int64_t dtype, const std::vector<int64_t>& sizes,
             const std::string& module, const std::string& variant) {
  static std::mutex m;
  static std::map<std::string, Entry> loaded;  // one dlopen per module file
  std::lock_guard<std::mutex> lock(m);
  Entry entry = nullptr;
  if (const auto it = loaded.find(module); it != loaded.end()) {
    entry = it->second;
  } else {
    void* handle = dlopen(module.c_str(), RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(handle != nullptr, "kforge: cannot load ", module, ": ", dlerror());
    entry = reinterpret_cast<Entry>(dlsym(handle, KFORGE_ENTRY_SYMBOL));
    TORCH_CHECK(entry != nullptr, "kforge: ", module, " has no ", KFORGE_ENTRY_SYMBOL);
    loaded[module] = entry;
  }
  tables().at(op).rows[{static_cast<int>(dtype), sizes}] = Row{entry, variant};
}

std::map<std::string, std::map<std::string, int64_t>> stats() {
  std::lock_guard<std::mutex> lock(stats_mutex());
  return stats_table();
}

void reset_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex());
  stats_table().clear();
}

}  // namespace

TORCH_LIBRARY(kforge, m) {
  m.def("rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("layernorm(Tensor x, Tensor weight, Tensor bias, float eps) -> Tensor");
  m.def("softmax(Tensor x) -> Tensor");
  m.def("cross_entropy(Tensor logits, Tensor targets) -> Tensor");
  m.def("rotary_embedding(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  m.def("rotary_embedding_half(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  m.def("reduce(Tensor x) -> Tensor");
}

// CompositeExplicitAutograd: the same function serves CUDA (kforge or the fallback) and CPU (the
// fallback, counted); autograd is registered in Python (no backward: a clear error).
TORCH_LIBRARY_IMPL(kforge, CompositeExplicitAutograd, m) {
  m.impl("rmsnorm", &rmsnorm);
  m.impl("layernorm", &layernorm);
  m.impl("softmax", &softmax);
  m.impl("cross_entropy", &cross_entropy);
  m.impl("rotary_embedding", &rotary_embedding);
  m.impl("rotary_embedding_half", &rotary_embedding_half);
  m.impl("reduce", &reduce);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("set_device", &set_device, "The GPU model (its name) the export was tuned for");
  module.def("add_op", &add_op, "An op's dispatch key: (input, dim, rank) per size");
  module.def("add_row", &add_row, "Route an op's dtype and sizes to a kforge module");
  module.def("stats", &stats, "Calls per op: 'kforge', or the reason they fell back");
  module.def("reset_stats", &reset_stats, "Forget the counts");
  module.def("count", &count, "Count a call of an op that the Python side sent elsewhere, and why");
}
