// For kernel files built on CUTLASS's GEMM collectives (`uses: cutlass`): the headers they
// need, and kf::CutlassElement, CUTLASS's type for the compiled 16-bit dtype.
#ifndef KFORGE_CUTLASS_GEMM_CUH_
#define KFORGE_CUTLASS_GEMM_CUH_

// CUTLASS 4.2's sm100 collectives (pulled in by the builders' headers, never instantiated
// here) capture `this` implicitly, which C++20 deprecates: six warnings per compile otherwise.
#pragma nv_diagnostic push
#pragma nv_diag_suppress 2908
#include <cute/tensor.hpp>

#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/kernel_hardware_info.h>
#include <cutlass/numeric_types.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#pragma nv_diagnostic pop

#include "kforge/elem_cuda.cuh"

namespace kf {

// kf_elem and CUTLASS's type of the same name share the 16-bit layout: pointers are
// reinterpreted, values never converted.
#if defined(KF_ELEM_BF16)
using CutlassElement = cutlass::bfloat16_t;
#elif defined(KF_ELEM_F16)
using CutlassElement = cutlass::half_t;
#else
#error "the CUTLASS kernel files are for bf16 and f16; fp32 has the CUDA-core files"
#endif
static_assert(sizeof(CutlassElement) == sizeof(kf_elem), "same storage");

}  // namespace kf

#endif  // KFORGE_CUTLASS_GEMM_CUH_
