/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Adversarial: returns at once and has a host thread of its own launch the work a little
// later, on a stream of its own, after the timer has stopped.
// expect: check=INVALID|WRONG bench=INVALID|WRONG tune=loses
#include <chrono>
#include <thread>

#include "honest_rmsnorm.cuh"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  const kf_args copy = *args;
  std::thread([copy] {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    cudaStream_t side = nullptr;
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    honest_rmsnorm_on(&copy, side);
    cudaStreamSynchronize(side);
  }).detach();
  return KF_OK;
}
