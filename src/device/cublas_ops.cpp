#include "device/cublas_ops.h"

#include <algorithm>
#include <cmath>

#include <cublas_v2.h>
#include <fmt/format.h>

#include "core/error.h"
#include "device/cuda_check.h"
#include "device/reference_kernels.h"

namespace kforge {
namespace {

// Row-major C[m, n] = A[m, k] @ B[k, n] is column-major C^T = B^T A^T: cuBLAS sees B first.
// `b_transposed`: B is given as [n, k] row-major (the "NT" layout of linear-layer weights).
// `beta`: C = A @ B + beta * C (C's old values read unless beta is 0).
void gemm(cublasHandle_t handle, const void* a, const void* b, void* c, int64_t m, int64_t n,
          int64_t k, bool b_transposed, cudaDataType type, cublasComputeType_t compute,
          float beta = 0.f) {
  const float one = 1.f;
  KF_CUBLAS_CHECK(cublasGemmEx(handle, b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N,
                               static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &one,
                               b, type, static_cast<int>(b_transposed ? k : n), a, type,
                               static_cast<int>(k), &beta, c, type, static_cast<int>(n), compute,
                               CUBLAS_GEMM_DEFAULT));
}

cudaDataType cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

class Handle {
 public:
  explicit Handle(cudaStream_t stream, bool pedantic) {
    KF_CUBLAS_CHECK(cublasCreate(&handle_));
    KF_CUBLAS_CHECK(cublasSetStream(handle_, stream));
    // The reference must be true fp32: no TF32, no reduced-precision reductions.
    if (pedantic) KF_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_PEDANTIC_MATH));
  }
  ~Handle() { cublasDestroy(handle_); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  operator cublasHandle_t() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// Device memory owned for the duration of one reference computation.
class DeviceFloats {
 public:
  explicit DeviceFloats(size_t count) {
    KF_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(count, 1) * sizeof(float)));
  }
  DeviceFloats(const std::vector<float>& host, cudaStream_t stream) : DeviceFloats(host.size()) {
    KF_CUDA_CHECK(cudaMemcpyAsync(ptr_, host.data(), host.size() * sizeof(float),
                                  cudaMemcpyHostToDevice, stream));
  }
  ~DeviceFloats() { cudaFree(ptr_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() const { return ptr_; }
  void download(std::vector<float>& host, cudaStream_t stream) const {
    KF_CUDA_CHECK(cudaMemcpyAsync(host.data(), ptr_, host.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream));
  }

 private:
  float* ptr_ = nullptr;
};

class MatmulBaseline final : public LibraryBaseline {
 public:
  MatmulBaseline(const Sizes& sizes, DType dtype, const std::vector<void*>& in,
                 const std::vector<void*>& out, cudaStream_t stream)
      : handle_(stream, false), sizes_(sizes), dtype_(dtype), in_(in), out_(out) {}
  void call() override {
    gemm(handle_, in_[0], in_[1], out_[0], sizes_.at("M"), sizes_.at("N"), sizes_.at("K"), false,
         cuda_type(dtype_), CUBLAS_COMPUTE_32F);
  }
  std::string_view describe() const override {
    return "cuBLAS GEMM (cublasGemmEx, fp32 accumulate)";
  }

 private:
  Handle handle_;
  Sizes sizes_;
  DType dtype_;
  std::vector<void*> in_, out_;
};

// What PyTorch eager runs for the SwiGLU MLP: two GEMMs, one elementwise silu * up, one GEMM.
class MlpBaseline final : public LibraryBaseline {
 public:
  MlpBaseline(const Sizes& sizes, DType dtype, const std::vector<void*>& in,
              const std::vector<void*>& out, cudaStream_t stream)
      : handle_(stream, false), sizes_(sizes), dtype_(dtype), in_(in), out_(out), stream_(stream) {
    const size_t bytes =
        static_cast<size_t>(sizes.at("batch") * sizes.at("hidden")) * dtype_size(dtype);
    for (void** p : {&gate_, &up_, &h_})
      KF_CUDA_CHECK(cudaMalloc(p, bytes));
  }
  ~MlpBaseline() override {
    for (void* p : {gate_, up_, h_})
      cudaFree(p);
  }
  void call() override {
    const int64_t b = sizes_.at("batch"), d = sizes_.at("dim"), h = sizes_.at("hidden");
    const cudaDataType type = cuda_type(dtype_);
    gemm(handle_, in_[0], in_[1], gate_, b, h, d, true, type, CUBLAS_COMPUTE_32F);
    gemm(handle_, in_[0], in_[2], up_, b, h, d, true, type, CUBLAS_COMPUTE_32F);
    launch_silu_mul(gate_, up_, h_, b * h, to_abi(dtype_), stream_);
    gemm(handle_, h_, in_[3], out_[0], b, d, h, true, type, CUBLAS_COMPUTE_32F);
  }
  std::string_view describe() const override {
    return "cuBLAS: gate GEMM, up GEMM, silu*up, down GEMM (as PyTorch eager)";
  }

 private:
  Handle handle_;
  Sizes sizes_;
  DType dtype_;
  std::vector<void*> in_, out_;
  cudaStream_t stream_;
  void* gate_ = nullptr;
  void* up_ = nullptr;
  void* h_ = nullptr;
};

}  // namespace

bool has_gpu_reference(std::string_view op) {
  return op == "matmul" || op == "matmul_bias" || op == "matmul_residual" || op == "fused_mlp" ||
         op == "flash_attention";
}

bool has_library_baseline(std::string_view op) {
  return op == "matmul" || op == "fused_mlp";
}

void compute_gpu_reference(std::string_view op, const Sizes& sizes, std::span<const double> scalars,
                           const std::vector<std::vector<float>>& inputs,
                           std::vector<std::vector<float>>& outputs, cudaStream_t stream) {
  std::vector<std::unique_ptr<DeviceFloats>> in;
  for (const auto& host : inputs)
    in.push_back(std::make_unique<DeviceFloats>(host, stream));
  DeviceFloats out(outputs.at(0).size());
  // A second output, when asked for, receives the root-sum-square magnitude of each element.
  std::unique_ptr<DeviceFloats> magnitude;
  if (outputs.size() > 1) magnitude = std::make_unique<DeviceFloats>(outputs[1].size());
  if (op == "matmul") {
    Handle handle(stream, true);
    const int64_t m = sizes.at("M"), n = sizes.at("N"), k = sizes.at("K");
    gemm(handle, in[0]->get(), in[1]->get(), out.get(), m, n, k, false, CUDA_R_32F,
         CUBLAS_COMPUTE_32F_PEDANTIC);
    if (magnitude) {  // sqrt((A*A) @ (B*B)): the root-sum-square of each dot product's terms
      launch_square(in[0]->get(), m * k, stream);
      launch_square(in[1]->get(), k * n, stream);
      gemm(handle, in[0]->get(), in[1]->get(), magnitude->get(), m, n, k, false, CUDA_R_32F,
           CUBLAS_COMPUTE_32F_PEDANTIC);
    }
  } else if (op == "matmul_bias" || op == "matmul_residual") {
    // C = A @ B + term: C starts as the term (the bias on every row: ones[M, 1] @ bias[1, N])
    // and the product is added to it. The magnitude is sqrt((A*A) @ (B*B) + term^2), the
    // root-sum-square of the K products and the term, built the same way from the squares.
    Handle handle(stream, true);
    const int64_t m = sizes.at("M"), n = sizes.at("N"), k = sizes.at("K");
    const bool bias = op == "matmul_bias";
    const std::vector<float> ones_host(bias ? static_cast<size_t>(m) : 0, 1.f);
    const DeviceFloats ones(ones_host, stream);
    const auto start_with_term = [&](float* c) {
      if (bias) {
        gemm(handle, ones.get(), in[2]->get(), c, m, n, 1, false, CUDA_R_32F,
             CUBLAS_COMPUTE_32F_PEDANTIC);
      } else {
        KF_CUDA_CHECK(cudaMemcpyAsync(c, in[2]->get(), static_cast<size_t>(m * n) * sizeof(float),
                                      cudaMemcpyDeviceToDevice, stream));
      }
    };
    start_with_term(out.get());
    gemm(handle, in[0]->get(), in[1]->get(), out.get(), m, n, k, false, CUDA_R_32F,
         CUBLAS_COMPUTE_32F_PEDANTIC, 1.f);
    if (magnitude) {
      for (size_t t = 0; t < 3; ++t)
        launch_square(in[t]->get(), static_cast<int64_t>(inputs[t].size()), stream);
      start_with_term(magnitude->get());
      gemm(handle, in[0]->get(), in[1]->get(), magnitude->get(), m, n, k, false, CUDA_R_32F,
           CUBLAS_COMPUTE_32F_PEDANTIC, 1.f);
    }
  } else if (op == "fused_mlp") {
    Handle handle(stream, true);
    const int64_t b = sizes.at("batch"), d = sizes.at("dim"), h = sizes.at("hidden");
    DeviceFloats gate(static_cast<size_t>(b * h)), up(static_cast<size_t>(b * h)),
        act(static_cast<size_t>(b * h));
    gemm(handle, in[0]->get(), in[1]->get(), gate.get(), b, h, d, true, CUDA_R_32F,
         CUBLAS_COMPUTE_32F_PEDANTIC);
    gemm(handle, in[0]->get(), in[2]->get(), up.get(), b, h, d, true, CUDA_R_32F,
         CUBLAS_COMPUTE_32F_PEDANTIC);
    launch_silu_mul(gate.get(), up.get(), act.get(), b * h, KF_DTYPE_F32, stream);
    gemm(handle, act.get(), in[3]->get(), out.get(), b, d, h, true, CUDA_R_32F,
         CUBLAS_COMPUTE_32F_PEDANTIC);
    if (magnitude) {  // of the down projection, whose error dominates
      launch_square(act.get(), b * h, stream);
      launch_square(in[3]->get(), d * h, stream);
      gemm(handle, act.get(), in[3]->get(), magnitude->get(), b, d, h, true, CUDA_R_32F,
           CUBLAS_COMPUTE_32F_PEDANTIC);
    }
  } else if (op == "flash_attention") {
    // S = Q K^T (batched fp32 GEMM), P = masked softmax(scale * S), O = P V, over chunks of
    // query heads so the score matrices stay within about 2 GiB. Under grouped-query attention
    // the query heads of a group share one key/value head: its K and V are given with a batch
    // stride of 0.
    Handle handle(stream, true);
    const int64_t s = sizes.at("seq_len"), d = sizes.at("head_dim");
    const int64_t heads = sizes.at("heads");
    const int64_t kv_heads =
        sizes.contains("kv_heads") && sizes.at("kv_heads") > 0 ? sizes.at("kv_heads") : heads;
    const int64_t group = heads / kv_heads;
    const int64_t chunk =
        std::clamp<int64_t>((int64_t{1} << 29) / (s * s), 1, sizes.at("batch") * heads);
    DeviceFloats scores(static_cast<size_t>(chunk * s * s));
    const float one = 1.f, zero = 0.f;
    // `count` query heads from q/o, against k/v advanced by kv_stride elements per head. With
    // `squares` (and V squared beforehand) o receives sum_j p_j^2 v_j^2, the magnitudes' squares.
    const auto attend = [&](const float* q, const float* k, const float* v, float* o, int64_t count,
                            int64_t kv_stride, bool squares) {
      // Row-major S[s, s] = Q[s, d] K[s, d]^T is column-major S^T = K Q^T.
      KF_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s), static_cast<int>(s),
          static_cast<int>(d), &one, k, CUDA_R_32F, static_cast<int>(d), kv_stride, q, CUDA_R_32F,
          static_cast<int>(d), s * d, &zero, scores.get(), CUDA_R_32F, static_cast<int>(s), s * s,
          static_cast<int>(count), CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
      launch_masked_softmax(scores.get(), count * s, s, static_cast<float>(scalars[0]),
                            scalars[1] != 0, stream);
      if (squares) launch_square(scores.get(), count * s * s, stream);
      // Row-major O[s, d] = P[s, s] V[s, d] is column-major O^T = V^T P^T.
      KF_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(d), static_cast<int>(s),
          static_cast<int>(s), &one, v, CUDA_R_32F, static_cast<int>(d), kv_stride, scores.get(),
          CUDA_R_32F, static_cast<int>(s), s * s, &zero, o, CUDA_R_32F, static_cast<int>(d), s * d,
          static_cast<int>(count), CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
    };
    const auto attend_all = [&](float* o, bool squares) {
      if (group == 1) {
        const int64_t bh = sizes.at("batch") * heads;
        for (int64_t h0 = 0; h0 < bh; h0 += chunk) {
          attend(in[0]->get() + h0 * s * d, in[1]->get() + h0 * s * d, in[2]->get() + h0 * s * d,
                 o + h0 * s * d, std::min(chunk, bh - h0), s * d, squares);
        }
        return;
      }
      // Query heads kvi * group ... kvi * group + group - 1 read key/value head kvi.
      for (int64_t kvi = 0; kvi < sizes.at("batch") * kv_heads; ++kvi) {
        for (int64_t r0 = 0; r0 < group; r0 += chunk) {
          const int64_t h0 = kvi * group + r0;
          attend(in[0]->get() + h0 * s * d, in[1]->get() + kvi * s * d, in[2]->get() + kvi * s * d,
                 o + h0 * s * d, std::min(chunk, group - r0), 0, squares);
        }
      }
    };
    attend_all(out.get(), false);
    if (magnitude) {
      launch_square(in[2]->get(), sizes.at("batch") * kv_heads * s * d, stream);
      attend_all(magnitude->get(), true);
    }
  } else {
    throw Error(fmt::format("no GPU reference for op '{}'", op));
  }
  KF_CUDA_CHECK(cudaGetLastError());
  out.download(outputs[0], stream);
  if (magnitude) magnitude->download(outputs[1], stream);
  KF_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (magnitude) {
    for (auto& v : outputs[1])
      v = std::sqrt(v);
  }
}

std::unique_ptr<LibraryBaseline> make_library_baseline(std::string_view op, const Sizes& sizes,
                                                       DType dtype,
                                                       const std::vector<void*>& inputs,
                                                       const std::vector<void*>& outputs,
                                                       cudaStream_t stream) {
  if (op == "matmul")
    return std::make_unique<MatmulBaseline>(sizes, dtype, inputs, outputs, stream);
  if (op == "fused_mlp")
    return std::make_unique<MlpBaseline>(sizes, dtype, inputs, outputs, stream);
  throw Error(fmt::format("no library baseline for op '{}'", op));
}

}  // namespace kforge
