#include "compile/linkage.h"

#include <algorithm>
#include <cctype>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/process.h"

namespace kforge {

std::string mangled_namespace(const std::string& name) {
  static const std::regex nested(R"(^_ZN[rVKRO]*(\d+))");
  std::smatch m;
  if (!std::regex_search(name, m, nested)) return "";
  const size_t length = std::stoul(m[1].str());
  const size_t start = static_cast<size_t>(m.length(0));
  return start + length <= name.size() ? name.substr(start, length) : "";
}

std::string demangled_namespace(const std::string& name) {
  int depth = 0;
  for (size_t i = 0; i + 1 < name.size(); ++i) {
    const char c = name[i];
    if (c == '<' || c == '(') ++depth;
    if (c == '>' || c == ')') --depth;
    if (depth == 0 && c == ':' && name[i + 1] == ':') {
      size_t begin = i;
      while (begin > 0 &&
             (std::isalnum(static_cast<unsigned char>(name[begin - 1])) || name[begin - 1] == '_'))
        --begin;
      return name.substr(begin, i - begin);
    }
  }
  return "";
}

std::vector<std::string> symbols_shared_between_variants(const std::filesystem::path& module,
                                                         const std::string& source) {
  std::vector<std::string> own;  // the namespaces the file opens
  const std::regex opened(R"(\bnamespace\s+([A-Za-z_]\w*)\s*\{)");
  for (auto it = std::sregex_iterator(source.begin(), source.end(), opened);
       it != std::sregex_iterator(); ++it) {
    own.push_back((*it)[1].str());
  }
  const CommandResult nm =
      run_command({"nm", "-C", "--defined-only", "--extern-only", module.string()});
  if (!nm.ok()) {
    throw Error(fmt::format("nm could not list the symbols of {} (binutils' nm is needed): {}",
                            module.string(), nm.output));
  }
  static const std::set<std::string> outside_namespaces = {
      "std",    "cute", "cutlass", "__gnu_cxx", "cub",
      "thrust", "cuda", "kf",      "kf_bulk",   "kf_attention"};
  static const std::vector<std::string> outside_names = {
      "kforge_run", "__cxx",  "_init", "_fini",    "__bss_start", "_edata",
      "_end",       "__cuda", "__nv",  "__fatbin", "typeinfo",    "vtable"};
  std::vector<std::string> shared;
  std::istringstream lines(nm.output);
  for (std::string line; std::getline(lines, line);) {
    // "ADDRESS TYPE NAME"
    const size_t type = line.find(' ');
    if (type == std::string::npos || type + 3 > line.size()) continue;
    std::string name = line.substr(type + 3);
    if (name.starts_with("guard variable for ")) name = name.substr(19);
    const bool mangled = name.starts_with("_Z");
    const std::string space = mangled ? mangled_namespace(name) : demangled_namespace(name);
    const bool known = outside_namespaces.contains(space) ||
                       std::any_of(outside_names.begin(), outside_names.end(),
                                   [&](const std::string& p) { return name.starts_with(p); });
    const bool its_own = std::any_of(own.begin(), own.end(), [&](const std::string& ns) {
      return name.find(mangled ? std::to_string(ns.size()) + ns : ns + "::") != std::string::npos;
    });
    if (!known || its_own) shared.push_back(line.substr(type + 1));
  }
  return shared;
}

std::string describe_shared_symbols(const std::string& file_name,
                                    const std::vector<std::string>& shared) {
  // The names and the fix come first: a loop's brief shows a failure's first line.
  std::vector<std::string> names;
  for (const std::string& symbol : shared)
    names.push_back(symbol.substr(symbol.find(' ') + 1));  // nm's "T name"
  constexpr size_t kNamed = 3;
  const std::string first =
      names.size() <= kNamed
          ? fmt::format("{}", fmt::join(names, "; "))
          : fmt::format("{}; and {} more", fmt::join(names.begin(), names.begin() + kNamed, "; "),
                        names.size() - kNamed);
  return fmt::format(
      "{} defines code with external linkage ({}): make it static or put it in an anonymous "
      "namespace (docs/kernel-format.md).\nThe standalone export links the file into one library "
      "beside the library's variants of the op, where a name both define would collide: the "
      "linker refuses the second copy or, for inline and template code, keeps one for all. "
      "Every such symbol:\n  {}",
      file_name, first, fmt::join(shared, "\n  "));
}

}  // namespace kforge
