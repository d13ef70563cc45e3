// What kforge computes with cuBLAS on the GPU, in a worker:
//   - GPU references (fp32, no TF32) for problems too large for the float64 host reference;
//   - baselines: the library calls PyTorch eager makes for matmul and the SwiGLU MLP, timed
//     beside a candidate with the same method.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include <cuda_runtime.h>

#include "core/dtype.h"
#include "ops/op_spec.h"

namespace kforge {

bool has_gpu_reference(std::string_view op);
bool has_library_baseline(std::string_view op);

// Computes `op` on the GPU in fp32 from fp32 host inputs into fp32 host outputs (sized by the
// caller). Throws kforge::Error for an op without a GPU reference.
void compute_gpu_reference(std::string_view op, const Sizes& sizes, std::span<const double> scalars,
                           const std::vector<std::vector<float>>& inputs,
                           std::vector<std::vector<float>>& outputs, cudaStream_t stream);

// A library baseline bound to device tensors; each call() launches it once on the stream.
class LibraryBaseline {
 public:
  virtual ~LibraryBaseline() = default;
  virtual void call() = 0;
  virtual std::string_view describe() const = 0;
};

// inputs/outputs: device pointers in the op's tensor order, in `dtype`.
std::unique_ptr<LibraryBaseline> make_library_baseline(std::string_view op, const Sizes& sizes,
                                                       DType dtype,
                                                       const std::vector<void*>& inputs,
                                                       const std::vector<void*>& outputs,
                                                       cudaStream_t stream);

}  // namespace kforge
