// The tensors of one problem (op, sizes, dtype) in a shared region a worker maps: inputs
// generated here, outputs poisoned with NaN before every run.
#pragma once

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/op_spec.h"
#include "run/protocol.h"
#include "run/shared_region.h"

namespace kforge {

// Elements in the largest tensor of a problem, without allocating it.
int64_t largest_tensor_elements(const OpSpec& op, const Sizes& sizes);

class CaseTensors {
 public:
  CaseTensors(const OpSpec& op, const Sizes& sizes, DType dtype);

  std::vector<HostTensor>& inputs() { return inputs_; }
  const std::vector<HostTensor>& inputs() const { return inputs_; }
  std::vector<HostTensor>& outputs() { return outputs_; }
  const std::vector<HostTensor>& outputs() const { return outputs_; }
  size_t largest_tensor_elements() const;

  void generate_inputs(InputKind kind, uint64_t seed);
  // The kind of the last generate_inputs() (normal until then).
  InputKind kind() const { return kind_; }
  // The trap drawn from `trap_seed` (see core/fresh_values.h), as a timed sample's trap changes
  // its inputs: the kTrapElements scattered elements of the first input it picks are redrawn, and
  // in every kept input with rows as many entries become copies of entries of other rows.
  void apply_trap(uint64_t trap_seed);
  // The kept inputs a trap changes entries of (fresh::trap_rows) as bytes, empty for the others;
  // and putting them back. A replayed trap leaves the kept inputs it changed here.
  std::vector<std::vector<std::byte>> kept_inputs() const;
  void restore_kept_inputs(const std::vector<std::vector<std::byte>>& saved);
  // Sets every bit of every output (a NaN in the floating types): an element a kernel does not
  // write is caught.
  void poison_outputs();
  // Inputs widened to double, for the reference.
  std::vector<std::vector<double>> inputs_as_double() const;
  // A run or bench request for `module` over these tensors.
  nlohmann::json request(const char* op, const std::filesystem::path& module,
                         const std::vector<double>& scalars) const;

 private:
  const OpSpec& op_;
  Sizes sizes_;
  SharedRegion region_;
  std::vector<TensorRef> refs_;
  std::vector<HostTensor> inputs_;
  std::vector<HostTensor> outputs_;
  InputKind kind_ = InputKind::normal;
};

}  // namespace kforge
