// A variant is one concrete build of a kernel file: its content, one value per parameter, a
// dtype and an architecture. It is a plain value: equal variants compile to the same module,
// and its key() names it in the cache, the logs and the results.
#pragma once

#include <string>

#include "compile/kernel_file.h"
#include "core/dtype.h"

namespace kforge {

struct Variant {
  std::string source_hash;  // KernelFile::text_hash: the file's text and its project headers
  std::string file_name;    // for people; not part of the identity
  ParamValues params;       // tunables and derived values
  DType dtype = DType::f32;
  Backend backend = Backend::cuda;
  std::string arch;  // "sm_90a", or "host" for the CPU backend

  static Variant make(const KernelFile& file, const ParamValues& params, DType dtype,
                      const std::string& arch);

  // "BLOCK_THREADS=256,VEC=8"
  std::string params_text() const;
  // Canonical identity: source hash, parameters, dtype, backend and arch.
  std::string key() const;
  // "rmsnorm_rowblock.cu [BLOCK_THREADS=256,VEC=8] bf16 sm_90a"
  std::string describe() const;

  bool operator==(const Variant& other) const {
    return source_hash == other.source_hash && params == other.params && dtype == other.dtype &&
           backend == other.backend && arch == other.arch;
  }
};

}  // namespace kforge
