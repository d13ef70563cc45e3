// Conversions between fp32 and the 16-bit floating types, rounding to nearest even: what every
// kernel accumulates through. Kernel files get them with kforge/elem_cuda.cuh; kforge's own
// device code includes this header alone.
#ifndef KFORGE_FLOAT_CONVERT_CUH_
#define KFORGE_FLOAT_CONVERT_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

#endif  // KFORGE_FLOAT_CONVERT_CUH_
