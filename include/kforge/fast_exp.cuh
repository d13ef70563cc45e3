// exp in one MUFU instruction, for the softmax-style kernels whose exponents are x - max <= 0.
#ifndef KFORGE_FAST_EXP_CUH_
#define KFORGE_FAST_EXP_CUH_

namespace kf {

// e^v for v <= 0 as ex2.approx(v * log2(e)): one FMUL and one MUFU.EX2, where expf takes
// about eight instructions. The shift by the maximum comes first, so v * log2(e) cannot
// overflow however large x is. Results below FLT_MIN flush to 0, far below any tolerance of an
// output in [0, 1]; the relative error (about 2^-22) is within f32 checks.
__device__ __forceinline__ float exp_nonpositive(float v) {
  constexpr float kLog2e = 1.4426950408889634f;
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(v * kLog2e));
  return e;
}

}  // namespace kf

#endif  // KFORGE_FAST_EXP_CUH_
