// What a worker does to itself before it loads any candidate code, so that the candidate
// cannot reach beyond the worker: no new processes or programs, no signals or ptrace to other
// processes, the first to go when memory runs out, and gone when kforge is gone.
#pragma once

#include <sys/types.h>
#include <optional>
#include <string>

namespace kforge {

// Dies with its parent (SIGKILL when kforge, or the launcher kforge started it under, exits;
// it exits at once if `kforge_pid` is already gone), asks the kernel to pick this process first
// when memory runs out, writes no core dumps and no file larger than `max_file_bytes` (whatever a
// candidate prints lands in a log file).
void limit_worker_process(pid_t kforge_pid, long long max_file_bytes);

// Runs this process (and the threads it starts) on CPU core `core` (modulo the cores there are)
// only. A failure is logged, not fatal: an unpinned slot is noisier, not wrong.
void pin_to_core(int core);

// Installs a seccomp filter: fork, vfork, execve and clone without CLONE_THREAD fail with
// EPERM (threads are still allowed), clone3 with ENOSYS (glibc then falls back to clone);
// kill, tgkill and tkill may reach only this process; ptrace, process_vm_readv/writev and
// pidfd_send_signal fail. Each such attempt is recorded (see forbidden_attempt()); one made
// with SIGSYS blocked (as glibc's posix_spawn does) ends the process instead. Returns ""
// when installed, else why not (the caller logs it and goes on with process groups as the only
// fence).
std::string forbid_new_processes();

// What the process last tried that the filter forbids ("start a process (fork/clone)", ...),
// once; nullopt when nothing was tried since the last look.
std::optional<std::string> forbidden_attempt();

}  // namespace kforge
