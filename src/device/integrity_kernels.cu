#include "device/integrity_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kforge/float_convert.cuh"

namespace kforge {
namespace {

// Enough blocks to fill an H100/H200 several times; grid-stride loops do the rest.
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 132 * 8;

int blocks_for(int64_t n) {
  return static_cast<int>(
      std::min<int64_t>(kMaxBlocks, std::max<int64_t>(1, (n + kThreads - 1) / kThreads)));
}

template <typename T>
__global__ void fill_normal_kernel(T* out, int64_t begin, int64_t end, float scale, uint64_t seed) {
  for (int64_t i = begin + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < end;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = kf_from_float<T>(__fmul_rn(fresh::normal_at(seed, static_cast<uint64_t>(i)), scale));
  }
}

template <typename T>
__global__ void fill_index_kernel(T* out, int64_t begin, int64_t end, int64_t bound,
                                  int64_t special, double special_share, uint64_t seed) {
  for (int64_t i = begin + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < end;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = static_cast<T>(
        fresh::index_at(seed, static_cast<uint64_t>(i), bound, special, special_share));
  }
}

template <typename Bits>
__global__ void digest_kernel(const Bits* data, int64_t count, unsigned long long* result) {
  unsigned long long hash = 0, poisoned = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t bits = static_cast<uint64_t>(data[i]);
    hash += fresh::digest_term(static_cast<uint64_t>(i), bits);
    poisoned += fresh::is_poison(bits, sizeof(Bits)) ? 1 : 0;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    hash += __shfl_down_sync(0xffffffffu, hash, offset);
    poisoned += __shfl_down_sync(0xffffffffu, poisoned, offset);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&result[0], hash);
    atomicAdd(&result[1], poisoned);
  }
}

// One applypriority per 128-byte L2 line. A line that is not in L2 is left alone (nothing is
// fetched), so a demotion costs no memory traffic.
__global__ void l2_demote_kernel(const char* data, size_t bytes) {
  constexpr size_t kLine = 128;
  const size_t first = reinterpret_cast<uintptr_t>(data) & ~(kLine - 1);
  const size_t end = reinterpret_cast<uintptr_t>(data) + bytes;
  for (size_t line = first + (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * kLine; line < end;
       line += size_t(gridDim.x) * blockDim.x * kLine) {
    asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(line) : "memory");
  }
}

}  // namespace

void launch_fill_fresh(void* data, kf_dtype dtype, int64_t begin, int64_t end,
                       const FreshInput& rule, uint64_t seed, cudaStream_t stream) {
  if (end <= begin || rule.kind == FreshInput::Kind::keep) return;
  const int blocks = blocks_for(end - begin);
  const auto scale = static_cast<float>(rule.scale);
  if (rule.kind == FreshInput::Kind::index) {
    if (dtype == KF_DTYPE_I64) {
      fill_index_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<int64_t*>(data), begin, end,
                                                         rule.bound, rule.special,
                                                         rule.special_share, seed);
    } else {
      fill_index_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<int32_t*>(data), begin, end,
                                                         rule.bound, rule.special,
                                                         rule.special_share, seed);
    }
    return;
  }
  switch (dtype) {
    case KF_DTYPE_F16:
      fill_normal_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<__half*>(data), begin, end,
                                                          scale, seed);
      break;
    case KF_DTYPE_BF16:
      fill_normal_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(data), begin,
                                                          end, scale, seed);
      break;
    default:
      fill_normal_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<float*>(data), begin, end,
                                                          scale, seed);
      break;
  }
}

void launch_l2_demote(const void* data, size_t bytes, cudaStream_t stream) {
  if (data == nullptr || bytes == 0) return;
  l2_demote_kernel<<<blocks_for(static_cast<int64_t>((bytes + 127) / 128)), kThreads, 0, stream>>>(
      static_cast<const char*>(data), bytes);
}

void launch_digest(const void* data, int64_t count, int element_bytes, unsigned long long* result,
                   cudaStream_t stream) {
  cudaMemsetAsync(result, 0, 2 * sizeof(unsigned long long), stream);
  if (count <= 0) return;
  const int blocks = blocks_for(count);
  switch (element_bytes) {
    case 2:
      digest_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint16_t*>(data), count,
                                                     result);
      break;
    case 8:
      digest_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint64_t*>(data), count,
                                                     result);
      break;
    default:
      digest_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint32_t*>(data), count,
                                                     result);
      break;
  }
}

}  // namespace kforge
