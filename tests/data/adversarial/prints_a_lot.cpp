/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Adversarial: prints megabytes to stdout and stderr on every call, and reads stdin. Neither
// reaches kforge's channel to the worker: what it prints is captured and shown, truncated, with
// its verdict.
// expect: check=OK bench=OK tune=any
#include <cstdio>
#include <string>

#include "honest_rmsnorm_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  static const std::string line(1000, 'x');
  for (int i = 0; i < 2000; ++i)
    std::printf("kernel says %d %s\n", i, line.c_str());
  std::fprintf(stderr, "kernel complains on stderr\n");
  std::fflush(stdout);
  char buffer[64];
  while (std::fread(buffer, 1, sizeof buffer, stdin) > 0) {
  }
  return honest_rmsnorm(args);
}
