// An op spec is the fixed evaluation of one op: its signature, float64 reference, cost model,
// size sets, dtypes, tolerances and input generators. Kernel files implement an op; they can
// never change its spec.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/fresh_values.h"

namespace kforge {

// Problem sizes by name, e.g. {M: 8192, N: 8192}.
using Sizes = std::map<std::string, int64_t, std::less<>>;

struct SizeCase {
  std::string label;
  Sizes sizes;
};

struct TensorSpec {
  std::string name;
  std::vector<std::string> dims;  // size names, e.g. {"M", "N"}
  bool is_output = false;
  // Parameters (weights) are always drawn random-normal; stability inputs apply to activations.
  bool is_parameter = false;
  // A dtype fixed by the op (e.g. int64 targets); otherwise the problem's dtype.
  std::optional<DType> fixed_dtype = std::nullopt;
  // For weights: the size whose 1/sqrt scales the draws (as in the usual initializations), so
  // products over that dimension stay O(1).
  std::string fan_in = "";
};

struct ScalarSpec {
  std::string name;
  double value = 0;
};

struct Tolerance {
  double atol = 0;
  double rtol = 0;
};

// The tolerance for `dtype` among the three floating dtypes kernels are compiled for.
inline Tolerance tolerance_by_dtype(DType dtype, Tolerance f16, Tolerance bf16, Tolerance f32) {
  return dtype == DType::f16 ? f16 : dtype == DType::bf16 ? bf16 : f32;
}

struct Cost {
  double bytes = 0;  // fewest bytes moved through device memory: inputs read once, outputs once
  double flops = 0;
};

// How activations are drawn. `normal` is the everyday case; the rest are the stability
// stage's adversarial inputs.
enum class InputKind {
  normal,
  near_max,      // |x| near the largest magnitude the op must handle in this dtype
  near_zero,     // |x| a few times the smallest normal value
  mixed_scales,  // blocks of 1e3 (or the op's safe magnitude / 8, if smaller) and 1e-3
  all_zeros,
  all_equal,
  very_negative,  // large negative values (softmax-like ops)
  near_constant,  // rows of one value plus tiny noise: variance ~ 0 (normalizations)
  cancelling,     // a row's first half +a, second half -a: partial sums peak, the sum is ~0
  fully_masked,   // every row masked or ignored (e.g. all cross-entropy targets ignore_index)
};
std::string_view input_kind_name(InputKind kind);

// A tensor in host memory (often a shared-memory region a worker also maps).
struct HostTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::byte* data = nullptr;
  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
};

class OpSpec {
 public:
  virtual ~OpSpec() = default;

  virtual std::string_view name() const = 0;
  virtual std::string_view formula() const = 0;
  // Size names in the order `--shape AxB` gives them.
  virtual std::vector<std::string> size_names() const = 0;
  virtual std::vector<TensorSpec> tensors() const = 0;  // inputs first, then outputs
  virtual std::vector<ScalarSpec> scalars() const { return {}; }
  // Adds sizes derived from the others (e.g. RoPE's half_dim = head_dim / 2).
  virtual void complete_sizes(Sizes&) const {}
  // Whether format_shape leaves out named size `name` at this problem: true where its value is
  // what the other sizes imply (flash_attention's kv_heads == heads), so that shapes written
  // before the size existed keep their text.
  virtual bool named_size_implied(const std::string&, const Sizes&) const { return false; }
  // Sizes given by name rather than position (e.g. attention's `causal`), with defaults.
  virtual Sizes named_size_defaults() const { return {}; }
  // The scalars passed to a kernel for one problem; by default the values of scalars().
  virtual std::vector<double> scalar_values(const Sizes& sizes) const;

  virtual std::vector<SizeCase> test_sizes() const = 0;
  virtual std::vector<SizeCase> edge_sizes() const = 0;
  virtual std::vector<SizeCase> bench_sizes() const = 0;
  virtual Sizes default_size() const = 0;
  virtual std::vector<DType> dtypes() const = 0;
  virtual Tolerance tolerance(DType dtype) const = 0;

  virtual std::vector<InputKind> stability_kinds() const;
  // The size the stability stage runs its adversarial inputs at: the smallest test size.
  virtual SizeCase stability_size() const { return test_sizes().front(); }
  // When true, reference() fills one extra vector per output (when given one) with each
  // element's magnitude: sum |x| for a row sum, the root-sum-square of the terms for a dot
  // product. The tolerance is then atol + rtol * max(|ref|, magnitude): the rounding error of a
  // sum scales with its terms, not with its (possibly cancelled) value.
  virtual bool tolerance_relative_to_magnitude() const { return false; }
  // The largest |x| the stability stage feeds. Defaults to 90% of the dtype's max; ops whose
  // accumulation in fp32 must not overflow cap it (see rmsnorm).
  virtual double max_input_magnitude(const Sizes& sizes, DType dtype) const;

  // Fills every input tensor. Deterministic in (sizes, kind, seed).
  virtual void generate(const Sizes& sizes, InputKind kind, uint64_t seed,
                        std::span<HostTensor> inputs) const;
  // How input `input` is redrawn on the device before every timed sample. By default floating
  // tensors get normal values (scaled by 1/sqrt(fan_in) for weights that name one); ops with
  // integer inputs or structured tables say what their inputs must look like.
  virtual FreshInput fresh_input(size_t input, const Sizes& sizes) const;
  // float64 reference: inputs widened to double, outputs sized by the caller.
  virtual void reference(const Sizes& sizes, std::span<const std::vector<double>> inputs,
                         std::span<const double> scalars,
                         std::span<std::vector<double>> outputs) const = 0;
  virtual Cost cost(const Sizes& sizes, DType dtype) const = 0;
  // Work of the float64 host reference; above kforge's limit, problems are checked against the
  // op's GPU reference instead (see reference_on_gpu()).
  virtual double reference_flops(const Sizes& sizes) const { return cost(sizes, DType::f32).flops; }
  // The spec whose reference judges inputs of `kind`: this one, except for a KernelBench
  // problem, whose Model judges its own inputs and whose kforge op judges kforge's adversarial
  // ones (where the op's rules for ill-conditioned results apply).
  virtual const OpSpec& reference_spec(InputKind, const Sizes&) const { return *this; }

  // Helpers built on the above.
  std::vector<TensorSpec> inputs() const;
  std::vector<TensorSpec> outputs() const;
  std::vector<int64_t> shape_of(const TensorSpec& tensor, const Sizes& sizes) const;
  DType dtype_of(const TensorSpec& tensor, DType problem_dtype) const {
    return tensor.fixed_dtype.value_or(problem_dtype);
  }
  // "8192x8192" or "4x32x4096x128,causal=0" -> sizes (named sizes take their defaults unless
  // given); throws UsageError naming the expected form.
  Sizes parse_shape(std::string_view text) const;
  std::string format_shape(const Sizes& sizes) const;
  // "x[M,N] weight[N] -> y[M,N]"
  std::string signature() const;
  bool supports(DType dtype) const;
};

// The op named `name`: one of kforge's, one registered while it runs, or one the resolver loads
// (a KernelBench problem, `kb:NAME`); null when none.
const OpSpec* find_op(std::string_view name);
// Adds an op at run time; names must not repeat. Returns the registered op.
const OpSpec* register_op(std::unique_ptr<OpSpec> spec);
// What find_op asks for a name it does not know (it registers what it loads).
void set_op_resolver(std::function<const OpSpec*(std::string_view)> resolver);
// The library's starter kernel file for an op in `dtype`, relative to the source tree's kernels/
// folder: what a device without a table runs, and the baseline a candidate is timed against
// when no vendor library implements the op. On CUDA, 16-bit matmuls start on the tensor cores
// (matmul_wgmma.cu); f32 keeps the CUDA-core file, whose f32 is true f32. matmul_bias and
// matmul_residual have their tensor-core file alone, in every dtype.
std::string starter_kernel(std::string_view op, bool cuda, DType dtype);
std::vector<const OpSpec*> all_ops();
// "rmsnorm, softmax"
std::string op_names();

}  // namespace kforge
