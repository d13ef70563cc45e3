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

// Where #include "NAME" finds its header, searched as the compiler searches it: beside the
// including header (`beside`; empty for the kernel file, which the compiler reads from a staged
// copy with nothing beside it), then the -I folders of Compiler::command_line: kforge's
// include/, the kernel file's folder and the library's op folders (a copy of a library file
// finds its op's shared header there, see local_headers()). Empty when none has it.
fs::path find_header(const std::string& name, const fs::path& beside, const fs::path& kernel_dir) {
  std::error_code ec;
  for (const fs::path& dir : {beside, default_include_dir(), kernel_dir}) {
    if (!dir.empty() && fs::is_regular_file(dir / name, ec)) return dir / name;
  }
  for (const auto& op_folder : fs::directory_iterator(library_kernels_dir(), ec)) {
    if (op_folder.is_directory() && fs::is_regular_file(op_folder.path() / name, ec))
      return op_folder.path() / name;
  }
  return {};
}

}  // namespace

std::vector<IncludedHeader> included_project_headers(const std::string& source,
                                                     const fs::path& path) {
  static const std::regex include_re(R"(#\s*include\s*\"([^\"]+)\")");
  struct Pending {
    std::string text;
    fs::path beside;
  };
  const fs::path kernel_dir = fs::absolute(path).parent_path();
  std::vector<IncludedHeader> headers;
  std::set<fs::path> seen;
  std::deque<Pending> pending = {{source, fs::path()}};
  while (!pending.empty()) {
    Pending file = std::move(pending.front());
    pending.pop_front();
    for (auto it = std::sregex_iterator(file.text.begin(), file.text.end(), include_re);
         it != std::sregex_iterator(); ++it) {
      const std::string name = (*it)[1].str();
      const fs::path found = find_header(name, file.beside, kernel_dir);
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
