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
  // At least `bytes` of memory on the current device, or nullptr when the allocation failed
  // (the error is cleared so that it does not stick to later calls) or the device is not one of
  // the first kMaxDevices. Each device has its own buffer, so a module called on two GPUs of one
  // process never hands one GPU's memory to the other.
  void* get(size_t bytes, cudaStream_t stream) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
      cudaGetLastError();
      return nullptr;
    }
    Buffer& buffer = buffers_[device];
    if (bytes <= buffer.bytes) return buffer.data;
    if (buffer.data != nullptr) cudaFreeAsync(buffer.data, stream);
    buffer = Buffer{};
    if (cudaMallocAsync(&buffer.data, bytes, stream) != cudaSuccess) {
      cudaGetLastError();
      buffer = Buffer{};
      return nullptr;
    }
    buffer.bytes = bytes;
    return buffer.data;
  }

 private:
  static constexpr int kMaxDevices = 64;
  struct Buffer {
    void* data = nullptr;
    size_t bytes = 0;
  };
  Buffer buffers_[kMaxDevices];
};

}  // namespace kf

#endif  // KFORGE_WORKSPACE_CUH_
