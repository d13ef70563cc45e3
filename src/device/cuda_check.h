// One checking macro per CUDA API: each records the call text, file, line and error name.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "core/error.h"

namespace kforge::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file,
                                          int line) {
  throw Error(fmt::format("{}:{}: {} failed: {} ({})", file, line, call, cudaGetErrorName(err),
                          cudaGetErrorString(err)));
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call,
                                            const char* file, int line) {
  throw Error(fmt::format("{}:{}: {} failed: {} ({})", file, line, call,
                          cublasGetStatusName(status), cublasGetStatusString(status)));
}

}  // namespace kforge::detail

#define KF_CUDA_CHECK(call)                                                   \
  do {                                                                        \
    const cudaError_t kf_err_ = (call);                                       \
    if (kf_err_ != cudaSuccess) {                                             \
      ::kforge::detail::throw_cuda_error(kf_err_, #call, __FILE__, __LINE__); \
    }                                                                         \
  } while (0)

#define KF_CUBLAS_CHECK(call)                                                      \
  do {                                                                             \
    const cublasStatus_t kf_status_ = (call);                                      \
    if (kf_status_ != CUBLAS_STATUS_SUCCESS) {                                     \
      ::kforge::detail::throw_cublas_error(kf_status_, #call, __FILE__, __LINE__); \
    }                                                                              \
  } while (0)
