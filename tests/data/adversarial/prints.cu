/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Adversarial: prints from the host and from the device on every call. Neither reaches kforge's
// channel to the worker: what it prints is captured and shown, truncated, with its verdict.
// expect: check=OK bench=OK tune=any
#include <cstdio>

#include "honest_rmsnorm.cuh"

__global__ void say_hello() {
  printf("hello from block %d\n", blockIdx.x);
}

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  std::printf("host says hello\n");
  std::fflush(stdout);
  say_hello<<<2, 1, 0, static_cast<cudaStream_t>(args->stream)>>>();
  return honest_rmsnorm(args);
}
