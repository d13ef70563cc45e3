/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Adversarial: leaves the work to a thread of its own, as background_thread.cpp does, and
// lowers the worker's descriptor limit to one past its lowest free descriptor, so that listing
// /proc/self/task still works but no thread's stat file can be opened: a count that skipped the
// threads it could not read would see none. kforge takes a count it cannot complete as a thread
// left running.
// expect: check=INVALID|CRASH bench=INVALID|CRASH tune=loses
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <thread>

#include "honest_rmsnorm_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  const kf_args copy = *args;
  std::thread([copy] {
    usleep(20000);  // the worker looks while the work has not started
    honest_rmsnorm(&copy);
  }).detach();
  int lowest_free = 0;
  while (fcntl(lowest_free, F_GETFD) != -1)
    ++lowest_free;
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = static_cast<rlim_t>(lowest_free + 1);
  setrlimit(RLIMIT_NOFILE, &limit);
  return KF_OK;
}
