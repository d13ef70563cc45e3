// Worker side: the tensors of one request on the device, each with guard bands on both sides
// (filled with a pattern and checked after a run, so a kernel that writes outside its tensors
// is caught even when it does not crash), and the kf_args a kernel receives for them.
#pragma once

#include <cstddef>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/backend.h"
#include "kforge/kernel.h"
#include "run/protocol.h"
#include "run/shared_region.h"

namespace kforge {

class DeviceTensors {
 public:
  // Allocates every tensor of `refs` and uploads it from `region` (inputs, and the outputs kforge
  // poisoned).
  DeviceTensors(DeviceBackend& backend, const SharedRegion& region,
                const std::vector<TensorRef>& refs);
  ~DeviceTensors();
  DeviceTensors(const DeviceTensors&) = delete;
  DeviceTensors& operator=(const DeviceTensors&) = delete;

  // The ABI view of these tensors; valid while this object lives and until the next call.
  kf_args args(const std::vector<double>& scalars, void* stream);
  // Device pointers of the inputs (or outputs), in order.
  std::vector<void*> pointers(bool outputs) const;
  std::vector<DeviceSpan> spans(bool outputs) const;
  std::vector<DeviceSpan> all_spans() const;  // inputs and outputs, in the call's order
  const std::vector<TensorRef>& refs() const { return refs_; }

  // Guard bands that are no longer intact: [{tensor, where, byte_offset}].
  nlohmann::json guard_violations();
  // Names of inputs whose device copy differs from the region's.
  nlohmann::json inputs_modified();
  // Device outputs (or inputs) into the shared region.
  void download(bool outputs);

 private:
  DeviceSpan span(size_t i) const;  // tensor i, inside its guard bands

  DeviceBackend& backend_;
  const SharedRegion& region_;
  std::vector<TensorRef> refs_;
  std::vector<std::byte*> bases_;  // allocations, leading guard band first
  std::vector<kf_tensor> abi_inputs_;
  std::vector<kf_tensor> abi_outputs_;
  std::vector<double> scalars_;
};

}  // namespace kforge
