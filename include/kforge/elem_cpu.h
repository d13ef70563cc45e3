// Element types for CPU kernel files.
//
// The CPU backend stores fp16 and bf16 as their 16-bit patterns, so kernels need no compiler
// support for half types. kforge defines exactly one of KF_ELEM_F16, KF_ELEM_BF16, KF_ELEM_F32
// when compiling; this header gives `kf_elem`, `kf_elem_dtype` and conversions through float
// with round-to-nearest-even, matching the GPU's __float2half_rn / __float2bfloat16_rn.
#ifndef KFORGE_ELEM_CPU_H_
#define KFORGE_ELEM_CPU_H_

#include <cstdint>
#include <cstring>

#include "kforge/kernel.h"

struct kf_f16 {
  uint16_t bits;
};
struct kf_bf16 {
  uint16_t bits;
};

inline float kf_bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline uint32_t kf_float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float kf_to_float(float v) {
  return v;
}

inline float kf_to_float(kf_bf16 v) {
  return kf_bits_to_float(uint32_t(v.bits) << 16);
}

inline float kf_to_float(kf_f16 v) {
  const uint32_t sign = uint32_t(v.bits & 0x8000u) << 16;
  const uint32_t exponent = (v.bits >> 10) & 0x1fu;
  uint32_t mantissa = v.bits & 0x3ffu;
  if (exponent == 0x1f) return kf_bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return kf_bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return kf_bits_to_float(sign);
  // Subnormal half: value = mantissa * 2^-24, exact in float.
  const float magnitude = float(mantissa) * 5.9604644775390625e-08f;
  return sign ? -magnitude : magnitude;
}

template <typename T>
T kf_from_float(float v);

template <>
inline float kf_from_float<float>(float v) {
  return v;
}

template <>
inline kf_bf16 kf_from_float<kf_bf16>(float v) {
  uint32_t bits = kf_float_to_bits(v);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return kf_bf16{uint16_t((bits >> 16) | 0x40u)};  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  return kf_bf16{uint16_t(bits >> 16)};
}

template <>
inline kf_f16 kf_from_float<kf_f16>(float v) {
  const uint32_t bits = kf_float_to_bits(v);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return kf_f16{uint16_t(sign | 0x7e00u)};   // NaN
  if (abs_bits >= 0x477ff000u) return kf_f16{uint16_t(sign | 0x7c00u)};  // rounds to infinity
  if (abs_bits < 0x38800000u) {
    // Result is subnormal (or zero): scale so the integer part is the half mantissa, then
    // let float addition round to nearest even.
    const float scaled = kf_bits_to_float(abs_bits) * 16777216.0f;  // * 2^24
    const float rounded = scaled + 8388608.0f - 8388608.0f;         // round to integer
    return kf_f16{uint16_t(sign | uint16_t(rounded))};
  }
  uint32_t rebased = abs_bits - (112u << 23);  // exponent bias 127 -> 15
  rebased += 0xfffu + ((rebased >> 13) & 1u);  // round to nearest, ties to even
  return kf_f16{uint16_t(sign | uint16_t(rebased >> 13))};
}

#if defined(KF_ELEM_F16)
typedef kf_f16 kf_elem;
#define kf_elem_dtype KF_DTYPE_F16
#elif defined(KF_ELEM_BF16)
typedef kf_bf16 kf_elem;
#define kf_elem_dtype KF_DTYPE_BF16
#elif defined(KF_ELEM_F32)
typedef float kf_elem;
#define kf_elem_dtype KF_DTYPE_F32
#endif

#endif  // KFORGE_ELEM_CPU_H_
