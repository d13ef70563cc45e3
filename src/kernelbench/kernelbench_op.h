// KernelBench-format problems as op specs (docs/kernelbench.md). A problem is a Python file
// with a PyTorch `Model`, `get_inputs()` and `get_init_inputs()`; as a kforge op, `kb:NAME`
// (NAME: the file's stem), its reference is that Model, run in float64 by a Python child
// (kernelbench_problem.py beside this file), and its everyday inputs are get_inputs()'s draws
// under a fresh seed. The problem names the kforge op whose signature it has (`KFORGE_OP`), or
// kforge identifies it (identify_signature_op): sizes, scalars, tolerances, adversarial inputs
// and cost are that op's, so the five stages, the integrity rules and the op's kernel files
// apply unchanged.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/op_spec.h"

namespace kforge {

class ProblemServer;

// The final timing of a problem: the kernel module and the Model (eager and torch.compile)
// timed by one method in one process, every call on fresh values; then the kernel's output on
// the last values compared with the Model's in float64 (at ten times the op's tolerance).
struct ProblemTiming {
  double kforge_us = 0;
  double eager_us = 0;
  double compile_us = 0;
  bool agrees_after_timing = false;
  double excess_over_tolerance = 0;  // the largest |got - want| beyond that tolerance
  std::string device;
  std::string torch_version;
};

class KernelBenchOp final : public OpSpec {
 public:
  // `described`: the Python child's description of the problem's tensors (its "describe" reply).
  // `server` may be null (tests): reference(), generate(normal) and time() then throw.
  // Throws UsageError when the problem's tensors do not fit the op it names.
  KernelBenchOp(std::string name, std::filesystem::path problem, const nlohmann::json& described,
                std::shared_ptr<ProblemServer> server);
  ~KernelBenchOp() override;

  const std::filesystem::path& problem() const { return problem_; }
  const OpSpec& signature_op() const { return *base_; }
  const Sizes& problem_sizes() const { return sizes_; }
  DType problem_dtype() const { return dtype_; }
  // How the signature op was found when the problem names none ("" when it names one).
  const std::string& identified() const { return identified_; }

  ProblemTiming time(const std::filesystem::path& module, double max_seconds) const;

  std::string_view name() const override { return name_; }
  std::string_view formula() const override { return formula_; }
  std::vector<std::string> size_names() const override { return base_->size_names(); }
  std::vector<TensorSpec> tensors() const override { return base_->tensors(); }
  std::vector<ScalarSpec> scalars() const override { return base_->scalars(); }
  void complete_sizes(Sizes& sizes) const override { base_->complete_sizes(sizes); }
  bool named_size_implied(const std::string& n, const Sizes& s) const override {
    return base_->named_size_implied(n, s);
  }
  Sizes named_size_defaults() const override { return base_->named_size_defaults(); }
  std::vector<double> scalar_values(const Sizes& s) const override {
    return base_->scalar_values(s);
  }
  // The problem has one size: every stage runs at it.
  std::vector<SizeCase> test_sizes() const override { return {{"problem", sizes_}}; }
  std::vector<SizeCase> edge_sizes() const override { return {}; }
  std::vector<SizeCase> bench_sizes() const override { return {{"problem", sizes_}}; }
  Sizes default_size() const override { return sizes_; }
  std::vector<DType> dtypes() const override { return {dtype_}; }
  Tolerance tolerance(DType dtype) const override { return base_->tolerance(dtype); }
  std::vector<InputKind> stability_kinds() const override { return base_->stability_kinds(); }
  bool tolerance_relative_to_magnitude() const override {
    return base_->tolerance_relative_to_magnitude();
  }
  double max_input_magnitude(const Sizes& s, DType d) const override {
    return base_->max_input_magnitude(s, d);
  }
  // Everyday inputs are the problem's own (get_inputs() and the Model's parameters under the
  // seed); the stability stage's adversarial kinds are the op's generators.
  void generate(const Sizes& sizes, InputKind kind, uint64_t seed,
                std::span<HostTensor> inputs) const override;
  FreshInput fresh_input(size_t input, const Sizes& s) const override {
    return base_->fresh_input(input, s);
  }
  void reference(const Sizes& sizes, std::span<const std::vector<double>> inputs,
                 std::span<const double> scalars,
                 std::span<std::vector<double>> outputs) const override;
  Cost cost(const Sizes& s, DType d) const override { return base_->cost(s, d); }
  // The reference runs on the problem's device, not on kforge's host: no host limit applies.
  double reference_flops(const Sizes&) const override { return 0; }
  // The Model judges the problem's own inputs; kforge's adversarial inputs (the stability
  // stage) are judged by the op's float64 host reference, which scales the tolerance of sums
  // and products by their magnitudes and which a run of the Model cannot give. They run at the
  // problem's size where that reference is affordable there, else at the op's own stability
  // size (as kforge checks the op itself).
  const OpSpec& reference_spec(InputKind kind, const Sizes&) const override {
    return kind == InputKind::normal ? *this : *base_;
  }
  SizeCase stability_size() const override;

 private:
  std::string name_;
  std::string formula_;
  std::filesystem::path problem_;
  const OpSpec* base_ = nullptr;
  Sizes sizes_;
  DType dtype_ = DType::f32;
  std::string identified_;
  std::shared_ptr<ProblemServer> server_;
};

// Why a problem's tensors (`described`) do not fit `op`'s signature ("" when they do), naming
// `where` (the problem file); on a fit, the sizes read off the tensors and the problem's dtype.
std::string signature_misfit(const OpSpec& op, const nlohmann::json& described,
                             const std::string& where, Sizes& sizes, DType& dtype);

// For a problem that names no KFORGE_OP (a KernelBench file as published): the kforge op whose
// signature its tensors fit and whose function its Model computes. Ops that share a signature
// (softmax, an element-wise ReLU: both [M, N] -> [M, N]) are told apart by behaviour:
// `model_disagrees(op)` runs the Model and `op`'s float64 host reference on the problem's own
// inputs and says where they differ beyond the op's tolerance (nullopt: they agree). It is asked
// only where that reference is affordable at the problem's size; a fit that cannot be judged so
// is taken by signature alone only when it is the only fit. Throws UsageError when no op is
// left, or more than one.
struct IdentifiedOp {
  std::string op;
  std::string how;  // for the op's description: "identified by ..."
};
IdentifiedOp identify_signature_op(
    const std::filesystem::path& problem, const nlohmann::json& described,
    const std::function<std::optional<std::string>(const OpSpec&)>& model_disagrees);

// "kb:NAME" for a problem file.
std::string kernelbench_op_name(const std::filesystem::path& problem);

// Loads a problem (starting its Python child), registers it as an op and returns it. The same
// file loaded twice gives the same op; two files of one stem are an error.
const KernelBenchOp& load_kernelbench_problem(const std::filesystem::path& problem);

// Makes find_op("kb:NAME") load NAME.py from the folders in $KFORGE_KERNELBENCH_PROBLEMS
// (colon-separated), so a kernel file or task that names a problem works in every command.
void install_kernelbench_resolver();
// Prepends `folder` to $KFORGE_KERNELBENCH_PROBLEMS (for this process and its children).
void add_kernelbench_folder(const std::filesystem::path& folder);

// The python3 that runs problems: one that imports torch (find_python_with).
std::string kernelbench_python();

// KernelBench's score: fast_p is the share of problems whose final kernel passed every stage
// and runs faster than the reference by more than p (fast_0: the share that passed).
struct ProblemScore {
  std::string name;
  bool passed = false;
  double speedup = 0;  // reference time / kernel time (0 when not timed)
};
double fast_p(const std::vector<ProblemScore>& scores, double p);

}  // namespace kforge
