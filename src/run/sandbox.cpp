#include "run/sandbox.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include <fmt/format.h>

namespace kforge {
namespace {

#if defined(__x86_64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_AARCH64;
#endif

// Offsets into struct seccomp_data; an argument's low 32 bits on a little-endian machine
// (pids and clone flags live there).
constexpr uint32_t kNrOffset = offsetof(seccomp_data, nr);
constexpr uint32_t kArchOffset = offsetof(seccomp_data, arch);
constexpr uint32_t arg_low(int i) {
  return static_cast<uint32_t>(offsetof(seccomp_data, args) + 8 * static_cast<size_t>(i));
}

// A small assembler for the filter: each rule tests the syscall number, then (optionally) its
// first argument, and returns. Jumps are relative, so rules are emitted in order and each one
// falls through to the next when its syscall does not match.
class Filter {
 public:
  void load(uint32_t offset) { add(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offset)); }
  void ret(uint32_t action) { add(BPF_STMT(BPF_RET | BPF_K, action)); }

  // if nr == syscall: return action
  void deny(long syscall, uint32_t action) {
    load(kNrOffset);
    add(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(syscall), 0, 1));
    ret(action);
  }

  // if nr == syscall: return ALLOW when the low word of argument `arg` is one of `allowed`,
  // else `action`.
  void allow_only(long syscall, int arg, const std::vector<uint32_t>& allowed, uint32_t action) {
    const auto n = static_cast<uint8_t>(allowed.size());
    load(kNrOffset);
    add(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(syscall), 0,
                 static_cast<uint8_t>(n + 3)));
    load(arg_low(arg));
    for (uint8_t i = 0; i < n; ++i) {
      // On a match, jump over the remaining tests and the denial to the ALLOW.
      add(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, allowed[i], static_cast<uint8_t>(n - i), 0));
    }
    ret(action);
    ret(SECCOMP_RET_ALLOW);
  }

  // if nr == syscall: return ALLOW when argument `arg` has any of `bits`, else `action`.
  void allow_if_bits(long syscall, int arg, uint32_t bits, uint32_t action) {
    load(kNrOffset);
    add(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(syscall), 0, 4));
    load(arg_low(arg));
    add(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, bits, 0, 1));
    ret(SECCOMP_RET_ALLOW);
    ret(action);
  }

  std::vector<sock_filter>& code() { return code_; }

 private:
  void add(sock_filter f) { code_.push_back(f); }
  std::vector<sock_filter> code_;
};

uint32_t fail_with(int errno_value) {
  return SECCOMP_RET_ERRNO | (static_cast<uint32_t>(errno_value) & SECCOMP_RET_DATA);
}

// The first forbidden system call made since forbidden_attempt() last looked, or -1.
std::atomic<int> g_forbidden_syscall{-1};

// A forbidden call traps here instead of running: it is recorded, and returns EPERM to its
// caller, as if the kernel had refused it.
void on_forbidden_syscall(int, siginfo_t* info, void* context) {
  int expected = -1;
  g_forbidden_syscall.compare_exchange_strong(expected, info->si_syscall);
  auto* uc = static_cast<ucontext_t*>(context);
#if defined(__x86_64__)
  uc->uc_mcontext.gregs[REG_RAX] = -EPERM;
#elif defined(__aarch64__)
  uc->uc_mcontext.regs[0] = static_cast<unsigned long long>(-EPERM);
#endif
}

}  // namespace

std::optional<std::string> forbidden_attempt() {
  const int nr = g_forbidden_syscall.exchange(-1);
  if (nr < 0) return std::nullopt;
  switch (nr) {
#ifdef __NR_fork
    case __NR_fork:
#endif
#ifdef __NR_vfork
    case __NR_vfork:
#endif
    case __NR_clone:
      return "start a process (fork/clone)";
    case __NR_execve:
    case __NR_execveat:
      return "run a program (exec)";
    case __NR_ptrace:
    case __NR_process_vm_readv:
    case __NR_process_vm_writev:
      return "reach into another process";
    default:
      return "signal another process";
  }
}

void limit_worker_process(pid_t kforge_pid, long long max_file_bytes) {
  // Dies with its parent: kforge, or the launcher (a sanitizer) kforge started it under.
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (::kill(kforge_pid, 0) != 0) std::_Exit(5);  // kforge ended before that was set
  std::ofstream("/proc/self/oom_score_adj") << 1000;
  const rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  const auto bytes = static_cast<rlim_t>(max_file_bytes);
  const rlimit file_size{bytes, bytes};
  setrlimit(RLIMIT_FSIZE, &file_size);
  // Past the limit, writes fail with EFBIG instead of killing the worker.
  std::signal(SIGXFSZ, SIG_IGN);
}

void pin_to_core(int core) {
  const int cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core % cores, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    std::fprintf(stderr, "kforge worker: cannot pin to core %d: %s\n", core % cores,
                 std::strerror(errno));
  }
}

std::string forbid_new_processes() {
#if !defined(__x86_64__) && !defined(__aarch64__)
  return "no seccomp filter for this architecture";
#else
  const auto self = static_cast<uint32_t>(getpid());
  // Forbidden calls trap (SIGSYS) so that the attempt is seen; if the handler cannot be set,
  // they fail with EPERM unseen.
  struct sigaction action {};
  action.sa_sigaction = on_forbidden_syscall;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  const uint32_t eperm =
      sigaction(SIGSYS, &action, nullptr) == 0 ? SECCOMP_RET_TRAP : fail_with(EPERM);
  Filter f;
  // A syscall made through another ABI (x32, or 32-bit x86) would bypass the numbers below.
  f.load(kArchOffset);
  f.code().push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 1, 0));
  f.ret(SECCOMP_RET_KILL_PROCESS);
#if defined(__x86_64__)
  f.load(kNrOffset);
  f.code().push_back(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1));  // __X32_SYSCALL_BIT
  f.ret(SECCOMP_RET_KILL_PROCESS);
#endif
#ifdef __NR_fork
  f.deny(__NR_fork, eperm);
#endif
#ifdef __NR_vfork
  f.deny(__NR_vfork, eperm);
#endif
  f.deny(__NR_execve, eperm);
  f.deny(__NR_execveat, eperm);
#ifdef __NR_clone3
  f.deny(__NR_clone3, fail_with(ENOSYS));  // its flags sit in memory the filter cannot read
#endif
  f.allow_if_bits(__NR_clone, 0, CLONE_THREAD, eperm);
  // kill(pid): this process, its own group (0, or -pid: the worker leads its group).
  f.allow_only(__NR_kill, 0, {self, 0u, static_cast<uint32_t>(-static_cast<int32_t>(self))}, eperm);
  f.allow_only(__NR_tgkill, 0, {self}, eperm);
  f.deny(__NR_tkill, eperm);
  f.deny(__NR_ptrace, eperm);
  f.deny(__NR_process_vm_readv, eperm);
  f.deny(__NR_process_vm_writev, eperm);
#ifdef __NR_pidfd_send_signal
  f.deny(__NR_pidfd_send_signal, eperm);
#endif
  f.ret(SECCOMP_RET_ALLOW);

  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    return fmt::format("PR_SET_NO_NEW_PRIVS: {}", std::strerror(errno));
  }
  sock_fprog program{static_cast<unsigned short>(f.code().size()), f.code().data()};
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0) != 0) {
    return fmt::format("PR_SET_SECCOMP: {}", std::strerror(errno));
  }
  return "";
#endif
}

}  // namespace kforge
