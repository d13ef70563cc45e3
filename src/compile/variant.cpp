#include "compile/variant.h"

#include <fmt/format.h>

namespace kforge {

Variant Variant::make(const KernelFile& file, const ParamValues& params, DType dtype,
                      const std::string& arch) {
  Variant v;
  v.source_hash = file.text_hash;
  v.file_name = file.path.filename().string();
  v.params = params;
  v.dtype = dtype;
  v.backend = file.backend;
  v.arch = file.backend == Backend::cpu ? "host" : arch;
  return v;
}

std::string Variant::params_text() const {
  std::string out;
  for (const auto& [name, value] : params) {
    if (!out.empty()) out += ',';
    out += fmt::format("{}={}", name, value);
  }
  return out;
}

std::string Variant::key() const {
  return fmt::format("{}|{}|{}|{}|{}", source_hash, params_text(), dtype_name(dtype),
                     backend_name(backend), arch);
}

std::string Variant::describe() const {
  return fmt::format("{} [{}] {} {}", file_name, params_text(), dtype_name(dtype), arch);
}

}  // namespace kforge
