/* kforge kernel ABI: the only contract between kforge and a kernel file.
 *
 * A kernel file (CUDA .cu or C++ .cpp) includes this header and defines one function:
 *
 *     KFORGE_ENTRY int kforge_run(const kf_args* args);
 *
 * kforge fills `args` with the op's tensors in the order its spec declares (see
 * docs/kernel-format.md), the op's scalar parameters, and a stream. The entry point does its
 * own launches on that stream and returns KF_OK, or a kf_status saying why it could not run.
 * It must not synchronize the device, allocate per call when it can avoid it, or print.
 *
 * Plain C so that any compiler (nvcc, g++, clang) agrees on the layout.
 */
#ifndef KFORGE_KERNEL_H_
#define KFORGE_KERNEL_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KFORGE_ABI_VERSION 1
#define KF_MAX_DIMS 6

typedef enum kf_dtype {
  KF_DTYPE_F16 = 0,
  KF_DTYPE_BF16 = 1,
  KF_DTYPE_F32 = 2,
  KF_DTYPE_F64 = 3,
  KF_DTYPE_I32 = 4,
  KF_DTYPE_I64 = 5,
} kf_dtype;

typedef enum kf_status {
  KF_OK = 0,
  KF_ERR_UNSUPPORTED = 1,   /* shape, dtype or layout this kernel cannot handle */
  KF_ERR_LAUNCH = 2,        /* a launch or API call failed */
  KF_ERR_OUT_OF_MEMORY = 3, /* the kernel's own allocation failed */
} kf_status;

/* A dense tensor. Strides are in elements; kforge passes row-major contiguous tensors. */
typedef struct kf_tensor {
  void* data;
  kf_dtype dtype;
  int32_t ndim;
  int64_t shape[KF_MAX_DIMS];
  int64_t stride[KF_MAX_DIMS];
} kf_tensor;

typedef struct kf_args {
  int32_t abi_version;
  int32_t num_inputs;
  const kf_tensor* inputs;
  int32_t num_outputs;
  const kf_tensor* outputs;
  int32_t num_scalars;
  const double* scalars;
  /* cudaStream_t on the CUDA backend; NULL on the CPU backend. */
  void* stream;
} kf_args;

#ifdef __cplusplus
#define KFORGE_EXTERN_C extern "C"
#else
#define KFORGE_EXTERN_C
#endif

#define KFORGE_ENTRY KFORGE_EXTERN_C __attribute__((visibility("default")))

/* Name of the entry symbol kforge looks up in a compiled module. */
#define KFORGE_ENTRY_SYMBOL "kforge_run"

/* Number of elements in a tensor. */
static inline int64_t kf_numel(const kf_tensor* t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t->ndim; ++i)
    n *= t->shape[i];
  return n;
}

/* Whether two tensors have the same rank and extents. */
static inline bool kf_same_shape(const kf_tensor* a, const kf_tensor* b) {
  if (a->ndim != b->ndim) return false;
  for (int32_t i = 0; i < a->ndim; ++i) {
    if (a->shape[i] != b->shape[i]) return false;
  }
  return true;
}

/* Whether `p` is a multiple of `bytes` (a vector access's or TMA's alignment). */
static inline bool kf_is_aligned(const void* p, size_t bytes) {
  return (uintptr_t)p % bytes == 0;
}

#endif /* KFORGE_KERNEL_H_ */
