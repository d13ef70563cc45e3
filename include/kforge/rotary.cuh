// The arithmetic of a rotary embedding, shared by the RoPE kernel files of both conventions:
// a pack's elements taken and put back two at a time, and the rotation of a pair computed so
// that it stays accurate where its two products nearly cancel.
#ifndef KFORGE_ROTARY_CUH_
#define KFORGE_ROTARY_CUH_

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

}  // namespace kf

#endif  // KFORGE_ROTARY_CUH_
