/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Adversarial: leaves the work to a thread of its own, as background_thread.cpp does, and names
// that thread so that its line in /proc/self/task/TID/stat reads as an exiting thread: a name
// may hold ')' and a newline, and a reader that stops at the first line and takes the last ')'
// in it reads the fields the name spells out (flags 4, PF_EXITING). kforge reads the whole
// file, finds the real fields after the name, and refuses the call for the thread it left.
// expect: check=INVALID|CRASH bench=INVALID|CRASH tune=loses
#include <sys/prctl.h>
#include <unistd.h>

#include <thread>

#include "honest_rmsnorm_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  const kf_args copy = *args;
  std::thread([copy] {
    prctl(PR_SET_NAME, ")R1+1+1+1+1+4\n", 0, 0, 0);
    usleep(20000);  // the worker looks while the work has not started
    honest_rmsnorm(&copy);
  }).detach();
  return KF_OK;
}
