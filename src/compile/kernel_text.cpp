#include "compile/kernel_text.h"

#include <deque>
#include <regex>
#include <set>
#include <system_error>

#include "compile/compiler.h"
#include "core/hash.h"
#include "core/json_file.h"

namespace kforge {
namespace fs = std::filesystem;

namespace {

// The names a text includes with #include "NAME", in order.
std::vector<std::string> quoted_includes(const std::string& text) {
  static const std::regex include_re(R"(#\s*include\s*\"([^\"]+)\")");
  std::vector<std::string> names;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), include_re);
       it != std::sregex_iterator(); ++it) {
    names.push_back((*it)[1].str());
  }
  return names;
}

// The header NAME in one of the library's op folders (kernels/matmul/matmul_common.cuh), or an
// empty path.
fs::path op_folder_header(const fs::path& kernels_dir, const std::string& name) {
  std::error_code ec;
  for (const auto& op_folder : fs::directory_iterator(kernels_dir, ec)) {
    if (op_folder.is_directory() && fs::is_regular_file(op_folder.path() / name, ec))
      return op_folder.path() / name;
  }
  return {};
}

}  // namespace

std::vector<fs::path> local_headers(const KernelFile& file) {
  std::vector<fs::path> headers;
  const fs::path beside = fs::absolute(file.path).parent_path();
  const fs::path kernels_dir = library_kernels_dir();
  for (const std::string& name : quoted_includes(file.source)) {
    std::error_code ec;
    const fs::path found =
        fs::exists(beside / name, ec) ? beside / name : op_folder_header(kernels_dir, name);
    if (!found.empty()) headers.push_back(found);
  }
  return headers;
}

std::vector<IncludedHeader> included_project_headers(const std::string& source,
                                                     const fs::path& path) {
  // Searched as the compiler searches: beside the including header (not for the kernel file,
  // which the compiler reads from a staged copy with nothing beside it), then the -I folders of
  // Compiler::command_line: kforge's include/, the kernel file's folder, the op folders.
  const fs::path kernel_dir = fs::absolute(path).parent_path();
  const fs::path include_dir = default_include_dir();
  const fs::path kernels_dir = library_kernels_dir();
  const auto find_header = [&](const std::string& name, const fs::path& beside) {
    std::error_code ec;
    for (const fs::path& dir : {beside, include_dir, kernel_dir}) {
      if (!dir.empty() && fs::is_regular_file(dir / name, ec)) return dir / name;
    }
    return op_folder_header(kernels_dir, name);
  };
  struct Pending {
    std::string text;
    fs::path beside;
  };
  std::vector<IncludedHeader> headers;
  std::set<fs::path> seen;
  std::deque<Pending> pending = {{source, fs::path()}};
  while (!pending.empty()) {
    Pending file = std::move(pending.front());
    pending.pop_front();
    for (const std::string& name : quoted_includes(file.text)) {
      const fs::path found = find_header(name, file.beside);
      if (found.empty()) continue;
      std::error_code ec;
      const fs::path canonical = fs::weakly_canonical(found, ec);
      if (!seen.insert(ec ? found : canonical).second) continue;
      headers.push_back({name, found, read_text_file(found)});
      pending.push_back({headers.back().text, found.parent_path()});
    }
  }
  return headers;
}

std::string kernel_text_hash(const std::string& source, const fs::path& path) {
  const std::vector<IncludedHeader> headers = included_project_headers(source, path);
  if (headers.empty()) return hash_hex(source);
  Hasher h;
  h.add("kernel-text-v1").add(source);
  for (const IncludedHeader& header : headers)
    h.add(header.name).add(header.text);
  return h.hex();
}

}  // namespace kforge
