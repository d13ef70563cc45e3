#include "core/json_file.h"

#include <fstream>

#include <fmt/format.h>
#include <unistd.h>

#include "core/error.h"

namespace kforge {

void write_json_atomically(const std::filesystem::path& path, const nlohmann::json& j, int indent) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  const std::filesystem::path temporary = path.string() + fmt::format(".tmp{}", ::getpid());
  {
    std::ofstream out(temporary);
    out << j.dump(indent) << "\n";
    if (!out) throw Error(fmt::format("cannot write {}", temporary.string()));
  }
  std::filesystem::rename(temporary, path);
}

}  // namespace kforge
