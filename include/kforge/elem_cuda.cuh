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

#include "kforge/float_convert.cuh"
#include "kforge/kernel.h"

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
