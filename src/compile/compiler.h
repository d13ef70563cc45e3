// Kernel file + variant -> loadable shared module, through nvcc (CUDA) or the system C++
// compiler (CPU). Modules are cached on disk under a hash of everything that went into them:
// the source, the kforge headers it can include, the full command line and the compiler's
// version. Entries are written to a temporary directory and renamed into place, so a crash
// never leaves a half-written module that a later run would trust.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "compile/kernel_file.h"
#include "compile/variant.h"

namespace kforge {

// Per-kernel-function resources as reported by ptxas (-Xptxas -v).
struct FunctionResources {
  std::string function;
  int registers = 0;
  long long static_shared_bytes = 0;
  long long stack_frame_bytes = 0;  // local memory per thread
  long long spill_store_bytes = 0;
  long long spill_load_bytes = 0;
  // Why ptxas serializes the function's wgmma instructions ("Potential Performance Loss"),
  // empty when it does not: each then waits for the one before, which costs a tensor-core
  // kernel a large part of its speed (e.g. reading one accumulator's registers while another
  // wgmma of the same stage is in flight, legal PTX).
  std::string serialized_wgmma;
};

struct ResourceReport {
  std::vector<FunctionResources> functions;  // empty on the CPU backend
  int max_registers() const;
  long long max_static_shared_bytes() const;
  long long max_stack_frame_bytes() const;
  bool spills() const;
  // The first function's reason why ptxas serializes its wgmma instructions; empty if none.
  std::string serialized_wgmma() const;
  std::string summary() const;  // "regs 32, smem 128 B, stack 0 B, no spills" or "n/a (cpu)"
};

// Parses ptxas -v output (and its performance notes about wgmma).
ResourceReport parse_ptxas_report(const std::string& log);

struct CompileResult {
  Variant variant;
  bool ok = false;
  std::filesystem::path module;  // the shared library, when ok
  ResourceReport resources;
  std::string log;      // compiler output (the error, when !ok)
  std::string command;  // the command line, for people
  bool from_cache = false;
  double seconds = 0;  // compile time (0 for a cache hit)
};

struct CompilerOptions {
  std::filesystem::path cache_dir;    // default: default_cache_dir()
  std::filesystem::path include_dir;  // kforge's include/; default: found beside the binary
  // CUTLASS's include/ (cutlass/, cute/), for files that `uses: cutlass`; default:
  // default_cutlass_include_dir()
  std::filesystem::path cutlass_include_dir;
  std::string nvcc = "";            // default: $KFORGE_NVCC, nvcc on PATH, /usr/local/cuda/bin/nvcc
  std::string cxx = "";             // default: $CXX or c++
  bool keep_intermediates = false;  // also keep PTX, cubin and SASS beside the module
  std::chrono::seconds time_limit{300};  // one compile's wall-clock limit
};

std::filesystem::path default_cache_dir();
std::filesystem::path default_include_dir();
// $KFORGE_CUTLASS_INCLUDE, else the headers scripts/setup unpacks from the nvidia-cutlass wheel
// (.deps/nvidia-cutlass/cutlass_library/source/include beside include/); empty when neither
// exists.
std::filesystem::path default_cutlass_include_dir();
// The nvcc flags a file that `uses: cutlass` is compiled with besides CUTLASS's include folder
// (also what an export's build gives those files).
const std::vector<std::string>& cutlass_compile_flags();
// The library's kernel files (kernels/<op>/...), beside include/ in the source tree.
std::filesystem::path library_kernels_dir();
// Whether `path` lies in library_kernels_dir() (links resolved).
bool is_library_file(const std::filesystem::path& path);
// The macro a kernel file is compiled with for `dtype` ("KF_ELEM_BF16", see elem_cuda.cuh).
std::string elem_macro_name(DType dtype);

class Compiler {
 public:
  explicit Compiler(CompilerOptions options = {});

  CompileResult compile(const KernelFile& file, const Variant& variant) const;
  // Compiles many variants on `jobs` threads (0: one per CPU core); results keep input order.
  std::vector<CompileResult> compile_all(const KernelFile& file,
                                         const std::vector<Variant>& variants,
                                         unsigned jobs = 0) const;
  // The same for variants of several files: (file, variant) pairs.
  std::vector<CompileResult> compile_all(
      const std::vector<std::pair<const KernelFile*, Variant>>& work, unsigned jobs = 0) const;
  // First line that names the compiler's release, e.g. "Cuda compilation tools, release 13.0,
  // V13.0.88" or "g++ (Debian 12.2.0-14) 12.2.0", for records.
  std::string toolkit_version(Backend backend) const;
  // The cache key a variant would be stored under (exposed for tests).
  std::string cache_key(const KernelFile& file, const Variant& variant) const;
  const CompilerOptions& options() const { return options_; }
  // CUTLASS's include/ for a file that uses it; throws UsageError when it is not installed.
  std::filesystem::path cutlass_include_dir(const KernelFile& file) const;

 private:
  std::vector<std::string> command_line(const KernelFile& file, const Variant& variant,
                                        const std::filesystem::path& source,
                                        const std::filesystem::path& output) const;
  std::string compiler_version(Backend backend) const;
  std::string headers_fingerprint(const KernelFile& file) const;

  CompilerOptions options_;
};

}  // namespace kforge
