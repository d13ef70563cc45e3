#include "core/json_file.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <unistd.h>

#include "core/error.h"

namespace kforge {

void write_json_atomically(const std::filesystem::path& path, const nlohmann::json& j, int indent) {
  write_text_atomically(path, j.dump(indent) + "\n");
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("cannot read {}", path.string()));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not JSON: {}", path.string(), e.what()));
  }
}

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot read {}", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text_atomically(const std::filesystem::path& path, const std::string& text) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  const std::filesystem::path temporary = path.string() + fmt::format(".tmp{}", ::getpid());
  {
    std::ofstream out(temporary);
    out << text;
    if (!out) throw Error(fmt::format("cannot write {}", temporary.string()));
  }
  std::filesystem::rename(temporary, path);
}

}  // namespace kforge
