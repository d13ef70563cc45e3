// Element types for CUDA kernel files.
//
// kforge compiles a kernel file once per dtype and defines exactly one of KF_ELEM_F16,
// KF_ELEM_BF16 or KF_ELEM_F32. This header turns that into `kf_elem` (the storage type),
// `kf_elem_dtype` (the kf_dtype the entry point should expect) and conversions through float,
// which is what every kernel here accumulates in.
#ifndef KFORGE_ELEM_CUDA_CUH_
#define KFORGE_ELEM_CUDA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kforge/kernel.h"

__device__ __forceinline__ float kf_to_float(float v) {
  return v;
}
__device__ __forceinline__ float kf_to_float(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float kf_to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T kf_from_float(float v);
template <>
__device__ __forceinline__ float kf_from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half kf_from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 kf_from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

#if defined(KF_ELEM_F16)
typedef __half kf_elem;
#define kf_elem_dtype KF_DTYPE_F16
#elif defined(KF_ELEM_BF16)
typedef __nv_bfloat16 kf_elem;
#define kf_elem_dtype KF_DTYPE_BF16
#elif defined(KF_ELEM_F32)
typedef float kf_elem;
#define kf_elem_dtype KF_DTYPE_F32
#else
#error "kforge compiles each kernel with one of KF_ELEM_F16, KF_ELEM_BF16, KF_ELEM_F32 defined"
#endif

#endif  // KFORGE_ELEM_CUDA_CUH_
