// A device workspace kept for the life of a kernel module.
//
// Kernels that need scratch memory (per-row partial results, say) should not allocate on every
// call: even the stream-ordered allocator costs microseconds, which is the whole run time of a
// small problem. A Workspace is allocated on first use and grown, never shrunk, when a call
// needs more; both happen in stream order (cudaMallocAsync / cudaFreeAsync on the call's
// stream), so calls on one stream never race on it. Calls of one module on two streams at once
// would share it: kernels that use a Workspace say so.
#ifndef KFORGE_WORKSPACE_CUH_
#define KFORGE_WORKSPACE_CUH_

#include <cstddef>

#include <cuda_runtime.h>

namespace kf {

class Workspace {
 public:
  // At least `bytes` of device memory, or nullptr when the allocation failed (the error is
  // cleared so that it does not stick to later calls).
  void* get(size_t bytes, cudaStream_t stream) {
    if (bytes <= bytes_) return data_;
    if (data_ != nullptr) cudaFreeAsync(data_, stream);
    data_ = nullptr;
    bytes_ = 0;
    if (cudaMallocAsync(&data_, bytes, stream) != cudaSuccess) {
      cudaGetLastError();
      data_ = nullptr;
      return nullptr;
    }
    bytes_ = bytes;
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kf

#endif  // KFORGE_WORKSPACE_CUH_
