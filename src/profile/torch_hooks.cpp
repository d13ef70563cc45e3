#include "profile/torch_hooks.h"

#include <fstream>

#include <fmt/format.h>

#include "core/error.h"

namespace kforge {
namespace fs = std::filesystem;

void write_torch_hooks(const fs::path& directory) {
  fs::create_directories(directory);
  const fs::path file = directory / "sitecustomize.py";
  std::ofstream out(file, std::ios::binary);
  const std::string_view text = torch_hooks_source();
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!out.flush()) throw Error(fmt::format("cannot write {}", file.string()));
}

}  // namespace kforge
