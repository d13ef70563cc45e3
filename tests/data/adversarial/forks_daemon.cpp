/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Adversarial: tries to leave processes behind that outlive kforge: a forked child that leaves
// the process group (setsid), a spawned program, a shell. A worker may not start processes:
// every attempt fails, and the attempt alone makes the (otherwise honest) kernel INVALID.
// expect: check=INVALID bench=INVALID tune=loses
#include <spawn.h>
#include <unistd.h>
#include <cstdlib>

#include "honest_rmsnorm_cpu.h"

extern char** environ;

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  const pid_t child = fork();
  if (child == 0) {
    setsid();
    if (fork() == 0) {
      char arg0[] = "sleep", arg1[] = "86397";
      char* argv[] = {arg0, arg1, nullptr};
      execvp("sleep", argv);
    }
    _exit(0);
  }
  pid_t spawned = 0;
  char arg0[] = "sleep", arg1[] = "86398";
  char* argv[] = {arg0, arg1, nullptr};
  posix_spawnp(&spawned, "sleep", nullptr, nullptr, argv, environ);
  if (std::system("sleep 86399 &") == -12345) return KF_ERR_LAUNCH;
  return honest_rmsnorm(args);
}
