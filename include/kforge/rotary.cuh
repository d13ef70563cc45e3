// What the RoPE kernel files of both conventions share: reading a call's tensors, a pack's
// elements taken and put back two at a time, and the rotation of a pair computed so that it
// stays accurate where its two products nearly cancel. Each file keeps its own idea, kernels
// and launch.
#ifndef KFORGE_ROTARY_CUH_
#define KFORGE_ROTARY_CUH_

#include <cstdint>
#include <type_traits>

#include "kforge/elem_access.cuh"
#include "kforge/elem_cuda.cuh"

namespace kf {

// Elements 2j and 2j + 1 of a pack as floats, and two floats packed into them. 16-bit elements
// move as one 32-bit word per pair (one conversion instruction each way); split into halves,
// each would take a register of its own and batched heads would no longer fit.
template <int kVec>
__device__ __forceinline__ float2 load_pair(const ElemPack<kVec>& p, int j) {
  if constexpr (std::is_same_v<kf_elem, __nv_bfloat16>) {
    // bf16 is the top half of an fp32: widening is a shift or a mask (cvt.f32.bf16 lets ptxas
    // widen every element as soon as it arrives, which costs registers).
    const unsigned word = reinterpret_cast<const unsigned*>(p.v)[j];
    return make_float2(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u));
  } else if constexpr (std::is_same_v<kf_elem, __half>) {
    return __half22float2(reinterpret_cast<const __half2*>(p.v)[j]);
  } else {
    return make_float2(p.v[2 * j], p.v[2 * j + 1]);
  }
}
template <int kVec>
__device__ __forceinline__ void store_pair(ElemPack<kVec>& p, int j, float lo, float hi) {
  if constexpr (std::is_same_v<kf_elem, __nv_bfloat16>) {
    reinterpret_cast<__nv_bfloat162*>(p.v)[j] = __floats2bfloat162_rn(lo, hi);
  } else if constexpr (std::is_same_v<kf_elem, __half>) {
    reinterpret_cast<__half2*>(p.v)[j] = __floats2half2_rn(lo, hi);
  } else {
    p.v[2 * j] = lo;
    p.v[2 * j + 1] = hi;
  }
}

// a * b - c * d with about one rounding's error even when the two products nearly cancel
// (Kahan's algorithm): c * d is rounded, its rounding error is recovered exactly by an fma and
// added back. Plain fp32 loses up to ulp(|a b|) to the cancellation, which for |x| ~ 1e38 is far
// more than |y| * rtol; f16 and bf16 inputs would not need it (their products are exact in fp32).
__device__ __forceinline__ float diff_of_products(float a, float b, float c, float d) {
  const float cd = __fmul_rn(c, d);
  const float cd_error = fmaf(-c, d, cd);  // cd - c * d, exactly
  return __fadd_rn(fmaf(a, b, -cd), cd_error);
}

// Rotates the pair (a, b) by the angle whose cosine and sine are c and s.
__device__ __forceinline__ void rotate(float a, float b, float c, float s, float& out_a,
                                       float& out_b) {
  out_a = diff_of_products(a, c, b, s);   // a c - b s
  out_b = diff_of_products(a, s, -b, c);  // a s + b c
}

// A RoPE call, in the compiled dtype: x, y: [batch, heads, seq_len, head_dim]; cos_table,
// sin_table: [seq_len, head_dim / 2].
struct RotaryCall {
  const kf_elem* x = nullptr;
  const kf_elem* cos_table = nullptr;
  const kf_elem* sin_table = nullptr;
  kf_elem* y = nullptr;
  int64_t batch_heads = 0;  // batch * heads
  int64_t seq_len = 0;
  int64_t head_dim = 0;  // even
  cudaStream_t stream = nullptr;

  bool empty() const { return batch_heads == 0 || seq_len == 0 || head_dim == 0; }
  int64_t head_elems() const { return seq_len * head_dim; }  // of x in one head
};

// Fills `call` from the ABI's arguments, or returns false for a call the files cannot take
// (KF_ERR_UNSUPPORTED): other tensor counts, dtypes or shapes, or an odd head_dim. An empty x
// is a call to take (call.empty(): nothing to launch); each file adds its own index limits.
inline bool read_rotary_call(const kf_args* args, RotaryCall& call) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return false;
  if (args->num_inputs != 3 || args->num_outputs != 1 || args->num_scalars != 0) return false;
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& cos_table = args->inputs[1];
  const kf_tensor& sin_table = args->inputs[2];
  const kf_tensor& y = args->outputs[0];
  if (x.dtype != kf_elem_dtype || cos_table.dtype != kf_elem_dtype ||
      sin_table.dtype != kf_elem_dtype || y.dtype != kf_elem_dtype) {
    return false;
  }
  if (x.ndim != 4 || !kf_same_shape(&x, &y) || cos_table.ndim != 2 ||
      !kf_same_shape(&cos_table, &sin_table)) {
    return false;
  }
  const int64_t seq_len = x.shape[2];
  const int64_t head_dim = x.shape[3];
  if (head_dim % 2 != 0 || cos_table.shape[0] != seq_len || cos_table.shape[1] != head_dim / 2) {
    return false;
  }
  call = {static_cast<const kf_elem*>(x.data),
          static_cast<const kf_elem*>(cos_table.data),
          static_cast<const kf_elem*>(sin_table.data),
          static_cast<kf_elem*>(y.data),
          x.shape[0] * x.shape[1],
          seq_len,
          head_dim,
          static_cast<cudaStream_t>(args->stream)};
  return true;
}

}  // namespace kf

#endif  // KFORGE_ROTARY_CUH_
