// Packs of elements, and loads and stores of a whole pack in one instruction, with or without
// cache hints, for CUDA kernel files.
//
// A struct of 16-bit elements copied with `=` may move element by element; these go through
// the built-in type of the pack's size (AccessBits), which is also the type the cache-hint
// intrinsics (__ldg, __ldcs, __stcs) take. The hinted forms are spelled out even where a plain
// access would do: once some stores are inline assembly (__stcs), the compiler can no longer
// prove that nothing writes x, and would stop using the read-only path for it on its own.
#ifndef KFORGE_ELEM_ACCESS_CUH_
#define KFORGE_ELEM_ACCESS_CUH_

#include <cstdint>
#include <cstring>

#include "kforge/elem_cuda.cuh"

namespace kf {

// kVec consecutive elements, aligned so that one instruction loads or stores all of them.
template <int kVec>
struct alignas(kVec * sizeof(kf_elem)) ElemPack {
  kf_elem v[kVec];
};

// The built-in type of each access size.
template <int kBytes>
struct AccessBits;
template <>
struct AccessBits<2> {
  using Type = unsigned short;
};
template <>
struct AccessBits<4> {
  using Type = unsigned int;
};
template <>
struct AccessBits<8> {
  using Type = uint2;
};
template <>
struct AccessBits<16> {
  using Type = uint4;
};

// *p in one access: from global or shared memory, no hint.
template <typename T>
__device__ __forceinline__ T load_bits(const T* p) {
  using Bits = typename AccessBits<sizeof(T)>::Type;
  const Bits bits = *reinterpret_cast<const Bits*>(p);
  T value;
  memcpy(&value, &bits, sizeof(T));
  return value;
}

// *p = value in one access, no hint.
template <typename T>
__device__ __forceinline__ void store_bits(T* p, const T& value) {
  using Bits = typename AccessBits<sizeof(T)>::Type;
  Bits bits;
  memcpy(&bits, &value, sizeof(T));
  *reinterpret_cast<Bits*>(p) = bits;
}

// *p, which nothing writes during the kernel, through the read-only data path (__ldg).
template <typename T>
__device__ __forceinline__ T load_readonly(const T* p) {
  using Bits = typename AccessBits<sizeof(T)>::Type;
  const Bits bits = __ldg(reinterpret_cast<const Bits*>(p));
  T value;
  memcpy(&value, &bits, sizeof(T));
  return value;
}

// *p, which nothing writes during the kernel: through the read-only path (__ldg), or, with
// kLastUse, marked as the last read of its data (__ldcs, evict-first).
template <bool kLastUse, typename T>
__device__ __forceinline__ T load(const T* p) {
  using Bits = typename AccessBits<sizeof(T)>::Type;
  const Bits* bits_ptr = reinterpret_cast<const Bits*>(p);
  const Bits bits = kLastUse ? __ldcs(bits_ptr) : __ldg(bits_ptr);
  T value;
  memcpy(&value, &bits, sizeof(T));
  return value;
}

// *p = value; with kStreaming evict-first (__stcs): the value is not read again by the kernel.
template <bool kStreaming, typename T>
__device__ __forceinline__ void store(T* p, const T& value) {
  if constexpr (kStreaming) {
    using Bits = typename AccessBits<sizeof(T)>::Type;
    Bits bits;
    memcpy(&bits, &value, sizeof(T));
    __stcs(reinterpret_cast<Bits*>(p), bits);
  } else {
    *p = value;
  }
}

// L2 residency of data a kernel reads. For a row read twice, the first read asks L2 to keep its
// lines (evict_last), so the second read finds them even while other blocks stream their rows
// through; the last read of any data marks its lines evict_first, since nothing reads them
// again.
enum class L2Residency { keep, release };

// The cache policy operand for loads with kResidency; make it once per thread, outside loops.
template <L2Residency kResidency>
__device__ __forceinline__ uint64_t l2_policy() {
  uint64_t policy;
  if constexpr (kResidency == L2Residency::keep) {
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  } else {
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  }
  return policy;
}

// *p, which nothing writes during the kernel, read through the read-only path with an L2 policy
// from l2_policy<kResidency>() (and the matching L1 priority).
template <L2Residency kResidency, typename T>
__device__ __forceinline__ T load_with_policy(const T* p, uint64_t policy) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 16,
                "2-, 4-, 8- or 16-byte packs");
  typename AccessBits<sizeof(T)>::Type bits;
  if constexpr (kResidency == L2Residency::keep) {
    if constexpr (sizeof(T) == 16) {
      asm("ld.global.nc.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
          : "=r"(bits.x), "=r"(bits.y), "=r"(bits.z), "=r"(bits.w)
          : "l"(p), "l"(policy));
    } else if constexpr (sizeof(T) == 8) {
      asm("ld.global.nc.L1::evict_last.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
          : "=r"(bits.x), "=r"(bits.y)
          : "l"(p), "l"(policy));
    } else if constexpr (sizeof(T) == 4) {
      asm("ld.global.nc.L1::evict_last.L2::cache_hint.u32 %0, [%1], %2;"
          : "=r"(bits)
          : "l"(p), "l"(policy));
    } else {
      asm("ld.global.nc.L1::evict_last.L2::cache_hint.u16 %0, [%1], %2;"
          : "=h"(bits)
          : "l"(p), "l"(policy));
    }
  } else {
    if constexpr (sizeof(T) == 16) {
      asm("ld.global.nc.L1::evict_first.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
          : "=r"(bits.x), "=r"(bits.y), "=r"(bits.z), "=r"(bits.w)
          : "l"(p), "l"(policy));
    } else if constexpr (sizeof(T) == 8) {
      asm("ld.global.nc.L1::evict_first.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
          : "=r"(bits.x), "=r"(bits.y)
          : "l"(p), "l"(policy));
    } else if constexpr (sizeof(T) == 4) {
      asm("ld.global.nc.L1::evict_first.L2::cache_hint.u32 %0, [%1], %2;"
          : "=r"(bits)
          : "l"(p), "l"(policy));
    } else {
      asm("ld.global.nc.L1::evict_first.L2::cache_hint.u16 %0, [%1], %2;"
          : "=h"(bits)
          : "l"(p), "l"(policy));
    }
  }
  T value;
  memcpy(&value, &bits, sizeof(T));
  return value;
}

}  // namespace kf

#endif  // KFORGE_ELEM_ACCESS_CUH_
