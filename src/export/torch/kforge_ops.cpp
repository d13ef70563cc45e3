// kforge's PyTorch extension: one custom op per kforge op (torch.ops.kforge.rmsnorm, ...), each
// running the compiled modules a `kforge export --target torch` chose for its sizes: the same
// shared objects kforge checked and timed, loaded with dlopen, called through the kernel ABI
// (kforge/kernel.h) on PyTorch's current stream.
//
// Every op returns packed (contiguous) tensors, whichever way it ran, as its fake implementation
// (kforge_ops/__init__.py) tells torch.compile.
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

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <initializer_list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/EmptyTensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include "kforge/kernel.h"

namespace {

using Entry = int (*)(const kf_args*);

// The most sizes in a dispatch key (the rotary embeddings have four), and tensors in and out
// of one call.
constexpr size_t kMaxKeySizes = 4;
constexpr size_t kMaxInputs = 4;
constexpr size_t kMaxOutputs = 1;

// Where one size of the dispatch key is read: input `input`'s dimension `dim` of `rank`.
struct DimSource {
  int64_t input;
  int64_t dim;
  int64_t rank;
};

struct Row {
  int dtype;
  std::array<int64_t, kMaxKeySizes> sizes{};
  Entry run = nullptr;
  std::string variant;
};

// One op's dispatch: its key, its rows (a handful, searched in order) and its call counts.
// Rows are written only while the package loads; calls only read them.
struct OpTable {
  std::vector<DimSource> key;
  std::vector<Row> rows;
  std::atomic<int64_t> kforge_calls{0};
  std::mutex fallback_mutex;  // fallbacks are the slow path: counted by reason under a lock
  std::map<std::string, int64_t> fallback_calls;
};

// The ops, listed once: X(name) for each (their tables, the library's registrations and the
// Python functions below are all made from this list).
// clang-format off
#define KFORGE_OPS(X) \
  X(rmsnorm)          \
  X(layernorm)        \
  X(softmax)          \
  X(cross_entropy)    \
  X(rotary_embedding) \
  X(rotary_embedding_half) \
  X(reduce)           \
  X(fused_mlp)
// clang-format on

#define KFORGE_OP_NAME(op) #op,
constexpr const char* kOpNames[] = {KFORGE_OPS(KFORGE_OP_NAME)};
#undef KFORGE_OP_NAME

// Every op's table, made once before any call: lookups never insert, so they need no lock.
std::map<std::string, OpTable>& tables() {
  static std::map<std::string, OpTable> t = [] {
    std::map<std::string, OpTable> made;
    for (const char* name : kOpNames)
      made.try_emplace(name);
    return made;
  }();
  return t;
}

OpTable& table_of(const std::string& op) {
  const auto it = tables().find(op);
  TORCH_CHECK(it != tables().end(), "kforge: no op named ", op);
  return it->second;
}

std::string& exported_device_name() {
  static std::string name;
  return name;
}

void count_fallback(OpTable& table, const char* why) {
  std::lock_guard<std::mutex> lock(table.fallback_mutex);
  ++table.fallback_calls[why];
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

// Whether device `index` is the GPU model the export was tuned for: asked of the driver once
// per device, then read without a lock.
bool exported_device(int index) {
  constexpr int kDevices = 64;
  static std::array<std::atomic<int8_t>, kDevices> known{};  // 0 unknown, 1 yes, 2 no
  if (index < 0 || index >= kDevices) return false;
  int8_t state = known[index].load(std::memory_order_relaxed);
  if (state == 0) {
    state = exported_device_name() == at::cuda::getDeviceProperties(index)->name ? 1 : 2;
    known[index].store(state, std::memory_order_relaxed);
  }
  return state == 1;
}

using Inputs = std::initializer_list<std::reference_wrapper<const at::Tensor>>;

// The row that covers `inputs`, or null with `why` set (a static string).
const Row* covering_row(const OpTable& table, Inputs inputs, const char*& why) {
  const at::Tensor& first = inputs.begin()->get();
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
  std::array<int64_t, kMaxKeySizes> sizes{};
  for (size_t k = 0; k < table.key.size(); ++k) {
    const DimSource& d = table.key[k];
    const at::Tensor& t = (inputs.begin() + d.input)->get();
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
    sizes[k] = value;
  }
  const int dtype = abi_dtype(first);
  bool dtype_known = false;
  for (const Row& row : table.rows) {
    if (row.dtype != dtype) continue;
    dtype_known = true;
    if (row.sizes == sizes) return &row;
  }
  why = dtype_known ? "shape: sizes not exported" : "dtype: not exported";
  return nullptr;
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

// The kernel ABI's arguments for one call; `in` and `out` hold the tensors they point to.
struct AbiCall {
  std::array<kf_tensor, kMaxInputs> in{};
  std::array<kf_tensor, kMaxOutputs> out{};
  kf_args args{};
};

void fill_call(AbiCall& call, Inputs inputs, const at::Tensor& output,
               c10::ArrayRef<double> scalars) {
  size_t n = 0;
  for (const at::Tensor& t : inputs)
    call.in[n++] = abi_tensor(t);
  call.out[0] = abi_tensor(output);
  call.args.abi_version = KFORGE_ABI_VERSION;
  call.args.num_inputs = static_cast<int32_t>(n);
  call.args.inputs = call.in.data();
  call.args.num_outputs = 1;
  call.args.outputs = call.out.data();
  call.args.num_scalars = static_cast<int32_t>(scalars.size());
  call.args.scalars = scalars.data();
  call.args.stream = at::cuda::getCurrentCUDAStream(output.device().index()).stream();
}

// Runs `op` through its exported module into the output `make_output` allocates, or returns an
// undefined tensor (counted with the reason) for the caller's ATen composite. Each op's table
// is found once (its first call); a covered call then takes no lock and allocates nothing but
// its output.
template <typename MakeOutput>
at::Tensor try_kforge(OpTable& table, const char* op, Inputs inputs, c10::ArrayRef<double> scalars,
                      MakeOutput make_output) {
  const char* why = nullptr;
  const Row* row = covering_row(table, inputs, why);
  if (row != nullptr) {
    // Switch devices only when the call's is not current (a guard costs runtime calls); the
    // output is then allocated on the current device.
    const at::Device device = inputs.begin()->get().device();
    std::optional<c10::cuda::CUDAGuard> guard;
    if (c10::cuda::current_device() != device.index()) guard.emplace(device);
    at::Tensor output = make_output();
    AbiCall call;
    fill_call(call, inputs, output, scalars);
    const int status = row->run(&call.args);
    if (status == KF_OK) {
      table.kforge_calls.fetch_add(1, std::memory_order_relaxed);
      return output;
    }
    TORCH_CHECK(status == KF_ERR_UNSUPPORTED, "kforge::", op, ": variant ", row->variant,
                " failed with status ", status);
    why = "the variant refused these tensors";  // it launched nothing
  }
  count_fallback(table, why);
  return {};
}

// ---- The ops, each with its ATen composite ----

// A packed CUDA tensor on the current device for a covered call's output, straight from
// PyTorch's caching allocator: not through the dispatcher, and without empty_cuda's device
// guard (try_kforge has made the call's device current).
at::Tensor cuda_empty(c10::IntArrayRef sizes, const at::Tensor& like) {
  constexpr c10::DispatchKeySet kCuda(c10::DispatchKey::CUDA);
  return at::detail::empty_generic(sizes, at::cuda::getCUDADeviceAllocator(), kCuda,
                                   like.scalar_type(), std::nullopt);
}

at::Tensor packed_like(const at::Tensor& x) {
  return cuda_empty(x.sizes(), x);
}

at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  static OpTable& table = table_of("rmsnorm");
  at::Tensor out = try_kforge(table, "rmsnorm", {x, weight}, {eps}, [&] { return packed_like(x); });
  if (out.defined()) return out;
  const at::Tensor xf = x.to(at::kFloat);
  return (xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps) * weight.to(at::kFloat))
      .to(x.scalar_type())
      .contiguous();
}

at::Tensor layernorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     double eps) {
  static OpTable& table = table_of("layernorm");
  at::Tensor out =
      try_kforge(table, "layernorm", {x, weight, bias}, {eps}, [&] { return packed_like(x); });
  if (out.defined()) return out;
  return at::layer_norm(x, {x.size(-1)}, weight, bias, eps).contiguous();
}

at::Tensor softmax(const at::Tensor& x) {
  static OpTable& table = table_of("softmax");
  at::Tensor out = try_kforge(table, "softmax", {x}, {}, [&] { return packed_like(x); });
  if (out.defined()) return out;
  return at::softmax(x, -1).contiguous();
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  static OpTable& table = table_of("cross_entropy");
  at::Tensor out = try_kforge(table, "cross_entropy", {logits, targets}, {},
                              [&] { return cuda_empty({}, logits); });
  if (out.defined()) return out;
  return at::cross_entropy_loss(logits.to(at::kFloat), targets, {}, at::Reduction::Mean, -100)
      .to(logits.scalar_type());
}

// cos and sin: [seq_len, head_dim / 2]; x: [batch, heads, seq_len, head_dim].
at::Tensor rotary_embedding_half(const at::Tensor& x, const at::Tensor& cos,
                                 const at::Tensor& sin) {
  static OpTable& table = table_of("rotary_embedding_half");
  at::Tensor out =
      try_kforge(table, "rotary_embedding_half", {x, cos, sin}, {}, [&] { return packed_like(x); });
  if (out.defined()) return out;
  const int64_t half = x.size(-1) / 2;
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor a = xf.narrow(-1, 0, half);
  const at::Tensor b = xf.narrow(-1, half, half);
  const at::Tensor c = cos.to(at::kFloat);
  const at::Tensor s = sin.to(at::kFloat);
  return at::cat({a * c - b * s, a * s + b * c}, -1).to(x.scalar_type()).contiguous();
}

// Pairs (x[2i], x[2i + 1]).
at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  static OpTable& table = table_of("rotary_embedding");
  at::Tensor out =
      try_kforge(table, "rotary_embedding", {x, cos, sin}, {}, [&] { return packed_like(x); });
  if (out.defined()) return out;
  auto shape = x.sizes().vec();
  shape.back() /= 2;
  shape.push_back(2);
  const at::Tensor pairs = x.to(at::kFloat).reshape(shape);
  const at::Tensor a = pairs.select(-1, 0);
  const at::Tensor b = pairs.select(-1, 1);
  const at::Tensor c = cos.to(at::kFloat);
  const at::Tensor s = sin.to(at::kFloat);
  return at::stack({a * c - b * s, a * s + b * c}, -1)
      .reshape(x.sizes())
      .to(x.scalar_type())
      .contiguous();
}

at::Tensor reduce(const at::Tensor& x) {
  static OpTable& table = table_of("reduce");
  at::Tensor out = try_kforge(table, "reduce", {x}, {},
                              [&] { return cuda_empty(x.sizes().slice(0, x.dim() - 1), x); });
  if (out.defined()) return out;
  return x.to(at::kFloat).sum(-1).to(x.scalar_type()).contiguous();
}

// SwiGLU: (silu(x w_gate^T) * (x w_up^T)) w_down^T, the weights as nn.Linear holds them
// (w_gate, w_up: [hidden, dim]; w_down: [dim, hidden]); x: [..., dim]. The kernels take x as
// [rows, dim], so a contiguous x is passed as that view; any other x is passed as it is, and
// covering_row says why it falls back.
at::Tensor fused_mlp(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                     const at::Tensor& w_down) {
  static OpTable& table = table_of("fused_mlp");
  const at::Tensor rows = x.dim() >= 2 && x.is_contiguous() ? x.view({-1, x.size(-1)}) : x;
  at::Tensor out = try_kforge(table, "fused_mlp", {rows, w_gate, w_up, w_down}, {}, [&] {
    return cuda_empty({rows.size(0), w_down.size(0)}, x);
  });
  if (out.defined()) {
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = w_down.size(0);
    return out.view(sizes);
  }
  return at::linear(at::silu(at::linear(x, w_gate)) * at::linear(x, w_up), w_down).contiguous();
}

// ---- Set-up and statistics, called from Python ----

void set_device(const std::string& name) {
  exported_device_name() = name;
}

void add_op(const std::string& op, const std::vector<std::vector<int64_t>>& key) {
  OpTable& table = table_of(op);
  TORCH_CHECK(key.size() <= kMaxKeySizes, "kforge: ", op, "'s dispatch key has more than ",
              kMaxKeySizes, " sizes");
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
  OpTable& table = table_of(op);
  TORCH_CHECK(sizes.size() == table.key.size(), "kforge: ", op, " row with ", sizes.size(),
              " sizes for a key of ", table.key.size());
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
  Row row{static_cast<int>(dtype), {}, entry, variant};
  std::copy(sizes.begin(), sizes.end(), row.sizes.begin());
  for (Row& existing : table.rows) {
    if (existing.dtype == row.dtype && existing.sizes == row.sizes) {
      existing = row;
      return;
    }
  }
  table.rows.push_back(row);
}

void count(const std::string& op, const std::string& why) {
  count_fallback(table_of(op), why.c_str());
}

std::map<std::string, std::map<std::string, int64_t>> stats() {
  std::map<std::string, std::map<std::string, int64_t>> out;
  for (auto& [op, table] : tables()) {
    std::map<std::string, int64_t> calls;
    {
      std::lock_guard<std::mutex> lock(table.fallback_mutex);
      calls = table.fallback_calls;
    }
    if (const int64_t n = table.kforge_calls.load(); n > 0) calls["kforge"] = n;
    if (!calls.empty()) out[op] = calls;
  }
  return out;
}

void reset_stats() {
  for (auto& [op, table] : tables()) {
    std::lock_guard<std::mutex> lock(table.fallback_mutex);
    table.fallback_calls.clear();
    table.kforge_calls = 0;
  }
}

// The host cost of a covered call, in microseconds: {the module's kforge_run alone (arguments
// made once), the op through this extension (dispatch, output allocation and the same launch),
// the dispatch's table lookup alone, the output's allocation alone}. The second less the first
// is what the extension adds to the launch; the last two say where it goes.
//
// Each is the median over `rounds` rounds of 256 calls issued while a sleep kernel holds the
// GPU, so that the GPU's pace (a small kernel's run time, a full launch queue) never sets the
// host's: a round whose calls found the GPU idle is timed again with a longer sleep.
std::vector<double> host_us_per_call(const std::string& op, const std::vector<at::Tensor>& inputs,
                                     const std::vector<double>& scalars, int64_t rounds) {
  using Clock = std::chrono::steady_clock;
  OpTable& table = table_of(op);
  TORCH_CHECK(!inputs.empty() && inputs.size() <= kMaxInputs, "kforge: 1 to ", kMaxInputs,
              " inputs");
  TORCH_CHECK(rounds > 0, "kforge: at least one round");
  const auto as_list = [&](auto&& body) {
    switch (inputs.size()) {
      case 1:
        return body(Inputs{inputs[0]});
      case 2:
        return body(Inputs{inputs[0], inputs[1]});
      case 3:
        return body(Inputs{inputs[0], inputs[1], inputs[2]});
      default:
        return body(Inputs{inputs[0], inputs[1], inputs[2], inputs[3]});
    }
  };
  const char* why = nullptr;
  const Row* row = as_list([&](Inputs list) { return covering_row(table, list, why); });
  TORCH_CHECK(row != nullptr, "kforge: ", op, " does not cover these inputs: ", why);
  // The op's function, chosen once: the timed loop below calls it and nothing else.
  const std::function<at::Tensor()> run_op = [&]() -> std::function<at::Tensor()> {
    if (op == "rmsnorm") return [&] { return rmsnorm(inputs[0], inputs[1], scalars.at(0)); };
    if (op == "layernorm")
      return [&] { return layernorm(inputs[0], inputs[1], inputs[2], scalars.at(0)); };
    if (op == "softmax") return [&] { return softmax(inputs[0]); };
    if (op == "cross_entropy") return [&] { return cross_entropy(inputs[0], inputs[1]); };
    if (op == "rotary_embedding")
      return [&] { return rotary_embedding(inputs[0], inputs[1], inputs[2]); };
    if (op == "rotary_embedding_half")
      return [&] { return rotary_embedding_half(inputs[0], inputs[1], inputs[2]); };
    if (op == "fused_mlp")
      return [&] { return fused_mlp(inputs[0], inputs[1], inputs[2], inputs[3]); };
    return [&] { return reduce(inputs[0]); };
  }();
  const at::Tensor output = run_op();
  AbiCall call;
  as_list([&](Inputs list) {
    fill_call(call, list, output, scalars);
    return 0;
  });
  const auto per_call = [&](auto&& body) {
    constexpr int kCalls = 256;
    for (int i = 0; i < 20; ++i)
      body();
    c10::cuda::device_synchronize();
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
    int64_t sleep_cycles = 20'000'000;  // about 10 ms at 2 GHz: 40 us a call
    std::vector<double> us;
    while (static_cast<int64_t>(us.size()) < rounds) {
      at::cuda::sleep(sleep_cycles);
      const auto start = Clock::now();
      for (int i = 0; i < kCalls; ++i)
        body();
      const auto stop = Clock::now();
      const bool gpu_held = cudaStreamQuery(stream) == cudaErrorNotReady;
      c10::cuda::device_synchronize();
      if (!gpu_held) {
        TORCH_CHECK(sleep_cycles < (int64_t{1} << 34), "kforge: the sleep never outlasted a round");
        sleep_cycles *= 2;
        continue;
      }
      us.push_back(std::chrono::duration<double, std::micro>(stop - start).count() / kCalls);
    }
    std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
    return us[us.size() / 2];
  };
  const double module_us = per_call([&] { TORCH_CHECK(row->run(&call.args) == KF_OK); });
  const double op_us = per_call([&] { run_op(); });
  const double lookup_us =
      per_call([&] { as_list([&](Inputs list) { return covering_row(table, list, why); }); });
  const double alloc_us = per_call([&] { (void)cuda_empty(output.sizes(), output); });
  return {module_us, op_us, lookup_us, alloc_us};
}

// ---- The ops for eager Python callers ----

// Python's arguments as an op's C++ parameters: a tensor (borrowed from its Python object) or a
// float.
template <typename Param>
struct FromPython;

template <>
struct FromPython<const at::Tensor&> {
  static const at::Tensor& get(PyObject* object) {
    TORCH_CHECK_TYPE(THPVariable_Check(object), "kforge: expected a tensor, got ",
                     Py_TYPE(object)->tp_name);
    return THPVariable_Unpack(object);
  }
};

template <>
struct FromPython<double> {
  static double get(PyObject* object) {
    const double value = PyFloat_AsDouble(object);
    if (value == -1.0 && PyErr_Occurred()) throw python_error();
    return value;
  }
};

// An op as a METH_FASTCALL function: its arguments are read straight from Python's argument
// array, without pybind11's overload resolution and casters (about as much host time as the
// rest of the call). Patched models call these outside compiled graphs.
template <auto Op>
struct PythonOp;

template <typename... Params, at::Tensor (*Op)(Params...)>
struct PythonOp<Op> {
  static PyObject* call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
    HANDLE_TH_ERRORS
    constexpr Py_ssize_t kArity = sizeof...(Params);
    TORCH_CHECK_TYPE(nargs == kArity, "kforge: takes ", kArity, " arguments, got ", nargs);
    return THPVariable_Wrap(invoke(args, std::index_sequence_for<Params...>{}));
    END_HANDLE_TH_ERRORS
  }

  template <size_t... I>
  static at::Tensor invoke(PyObject* const* args, std::index_sequence<I...>) {
    return Op(FromPython<Params>::get(args[I])...);
  }
};

#define KFORGE_PYTHON_OP(op)                                                               \
  {#op, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&PythonOp<&op>::call)), \
   METH_FASTCALL, "kforge::" #op ", called without torch.ops' dispatch"},
PyMethodDef python_ops[] = {KFORGE_OPS(KFORGE_PYTHON_OP){nullptr, nullptr, 0, nullptr}};
#undef KFORGE_PYTHON_OP

}  // namespace

TORCH_LIBRARY(kforge, m) {
  m.def("rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("layernorm(Tensor x, Tensor weight, Tensor bias, float eps) -> Tensor");
  m.def("softmax(Tensor x) -> Tensor");
  m.def("cross_entropy(Tensor logits, Tensor targets) -> Tensor");
  m.def("rotary_embedding(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  m.def("rotary_embedding_half(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  m.def("reduce(Tensor x) -> Tensor");
  m.def("fused_mlp(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down) -> Tensor");
}

// CompositeExplicitAutograd: the same function serves CUDA (kforge or the fallback) and CPU (the
// fallback, counted); autograd is registered in Python (no backward: a clear error).
TORCH_LIBRARY_IMPL(kforge, CompositeExplicitAutograd, m) {
#define KFORGE_IMPL(op) m.impl(#op, &op);
  KFORGE_OPS(KFORGE_IMPL)
#undef KFORGE_IMPL
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("set_device", &set_device, "The GPU model (its name) the export was tuned for");
  module.def("add_op", &add_op, "An op's dispatch key: (input, dim, rank) per size");
  module.def("add_row", &add_row, "Route an op's dtype and sizes to a kforge module");
  module.def("stats", &stats, "Calls per op: 'kforge', or the reason they fell back");
  module.def("reset_stats", &reset_stats, "Forget the counts");
  module.def("count", &count, "Count a call of an op that the Python side sent elsewhere, and why");
  // The ops themselves, for eager callers: a direct call costs less than torch.ops' dispatch
  // from Python. torch.compile traces torch.ops.kforge.* instead (kforge_ops/patch.py).
  if (PyModule_AddFunctions(module.ptr(), python_ops) != 0) throw pybind11::error_already_set();
  module.def("host_us_per_call", &host_us_per_call,
             "Host microseconds per covered call: [the module alone, the op through the "
             "extension, the table lookup alone, the output's allocation alone]");
}
