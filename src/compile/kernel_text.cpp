#include "compile/kernel_text.h"

#include <algorithm>
#include <cctype>
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

namespace {

bool is_identifier_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// The text with its line splices (a backslash ending a line) removed, as translation phase 2
// does, and where each remaining character stood in the text (one more entry: the text's end).
struct Spliced {
  std::string text;
  std::vector<size_t> origin;
};

Spliced remove_splices(const std::string& text) {
  Spliced s;
  s.text.reserve(text.size());
  s.origin.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    if (text[i] == '\\') {
      if (i + 1 < text.size() && text[i + 1] == '\n') {
        i += 2;
        continue;
      }
      if (i + 2 < text.size() && text[i + 1] == '\r' && text[i + 2] == '\n') {
        i += 3;
        continue;
      }
    }
    s.text += text[i];
    s.origin.push_back(i);
    ++i;
  }
  s.origin.push_back(text.size());
  return s;
}

// The end of the quoted literal (string or character) that opens at `open`: one past its closing
// quote, or the end of its line when it has none (the compiler refuses that; the text is kept).
size_t quoted_literal_end(const std::string& s, size_t open) {
  const char quote = s[open];
  for (size_t i = open + 1; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == quote) {
      return i + 1;
    } else if (s[i] == '\n') {
      return i;
    }
  }
  return s.size();
}

// The end of the raw string literal whose quote is at `quote` (R"delim(...)delim"), or npos when
// no valid delimiter follows.
size_t raw_literal_end(const std::string& s, size_t quote) {
  const size_t paren = s.find('(', quote + 1);
  if (paren == std::string::npos || paren - quote - 1 > 16) return std::string::npos;
  const std::string delimiter = s.substr(quote + 1, paren - quote - 1);
  for (const char c : delimiter) {
    if (is_space(c) || c == ')' || c == '\\') return std::string::npos;
  }
  const size_t close = s.find(")" + delimiter + "\"", paren + 1);
  return close == std::string::npos ? s.size() : close + delimiter.size() + 2;
}

// The end of the preprocessing number that starts at `start`: digits, letters, '_', '.', a sign
// after an exponent letter, and a digit separator before a digit or letter.
size_t pp_number_end(const std::string& s, size_t start) {
  size_t i = start;
  while (i < s.size()) {
    const char c = s[i];
    const bool has_next = i + 1 < s.size();
    if ((c == 'e' || c == 'E' || c == 'p' || c == 'P') && has_next &&
        (s[i + 1] == '+' || s[i + 1] == '-')) {
      i += 2;
    } else if (c == '\'' && has_next && is_identifier_char(s[i + 1])) {
      i += 2;
    } else if (is_identifier_char(c) || c == '.') {
      ++i;
    } else {
      break;
    }
  }
  return i;
}

// The identifier that ends just before `end` in `s`, if any.
std::string_view identifier_before(const std::string& s, size_t end) {
  size_t start = end;
  while (start > 0 && is_identifier_char(s[start - 1]))
    --start;
  return std::string_view(s).substr(start, end - start);
}

// Whether the code written so far ends where a header name (<...>) may follow: an #include,
// #include_next or #import line, or just inside __has_include( or __has_include_next(. The code
// is written with one space at most between tokens and none at a line's start.
bool expects_header_name(std::string_view code) {
  const size_t newline = code.rfind('\n');
  const std::string_view line = code.substr(newline == std::string_view::npos ? 0 : newline + 1);
  if (line.starts_with('#')) {
    std::string_view directive = line.substr(1);
    if (directive.starts_with(' ')) directive.remove_prefix(1);
    if (directive == "include" || directive == "include_next" || directive == "import") return true;
  }
  for (const std::string_view opening :
       {"__has_include(", "__has_include (", "__has_include_next(", "__has_include_next ("}) {
    if (line.ends_with(opening)) return true;
  }
  return false;
}

bool is_raw_prefix(std::string_view prefix) {
  return prefix == "R" || prefix == "u8R" || prefix == "uR" || prefix == "UR" || prefix == "LR";
}

}  // namespace

std::string code_without_comments(const std::string& text) {
  const Spliced spliced = remove_splices(text);
  const std::string& s = spliced.text;
  std::string code;
  code.reserve(s.size());
  bool space = false, newline = false;  // whitespace (or a comment) waiting to be written
  const auto emit = [&](std::string_view token) {
    if (!code.empty() && (space || newline)) code += newline ? '\n' : ' ';
    space = newline = false;
    code += token;
  };
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    const char next = i + 1 < s.size() ? s[i + 1] : '\0';
    if (c == '/' && next == '/') {  // to the end of the line; the newline stays
      const size_t end = s.find('\n', i);
      i = end == std::string::npos ? s.size() : end;
      space = true;
    } else if (c == '/' && next == '*') {  // one space, whatever lines it spans
      const size_t end = s.find("*/", i + 2);
      if (end == std::string::npos) {  // unterminated: the compiler refuses it, keep it all
        emit(std::string_view(s).substr(i));
        break;
      }
      i = end + 2;
      space = true;
    } else if (c == '"' && is_raw_prefix(identifier_before(s, i))) {
      // A raw string undoes the splices before its delimiters are found: it is read, and kept,
      // as written.
      const size_t from = spliced.origin[i];
      const size_t to = raw_literal_end(text, from);
      if (to == std::string::npos) {
        const size_t plain_end = quoted_literal_end(s, i);
        emit(std::string_view(s).substr(i, plain_end - i));
        i = plain_end;
      } else {
        emit(std::string_view(text).substr(from, to - from));
        i = std::lower_bound(spliced.origin.begin(), spliced.origin.end(), to) -
            spliced.origin.begin();
      }
    } else if (c == '<' && expects_header_name(code)) {  // <a//b.h> names a file
      const size_t close = s.find_first_of(">\n", i + 1);
      const size_t end = close == std::string::npos ? s.size() : close + (s[close] == '>');
      emit(std::string_view(s).substr(i, end - i));
      i = end;
    } else if (c == '"' || c == '\'') {
      const size_t end = quoted_literal_end(s, i);
      emit(std::string_view(s).substr(i, end - i));
      i = end;
    } else if ((std::isdigit(static_cast<unsigned char>(c)) ||
                (c == '.' && std::isdigit(static_cast<unsigned char>(next)))) &&
               (i == 0 || !is_identifier_char(s[i - 1]))) {
      const size_t end = pp_number_end(s, i);
      emit(std::string_view(s).substr(i, end - i));
      i = end;
    } else if (is_space(c)) {
      (c == '\n' ? newline : space) = true;
      ++i;
    } else {
      emit(std::string_view(s).substr(i, 1));
      ++i;
    }
  }
  return code;
}

std::string kernel_code_for_hash(const std::string& text) {
  const std::string code = code_without_comments(text);
  // Code that reads its own line numbers changes with a comment's lines: its text counts whole.
  // Token pasting (##) can spell __LINE__ from pieces, so code that pastes counts whole too.
  for (const char* line_dependent : {"__LINE__", "__builtin_LINE", "source_location", "##"}) {
    if (code.find(line_dependent) != std::string::npos) return text;
  }
  return code;
}

std::string kernel_text_hash(const std::string& source, const fs::path& path) {
  Hasher h;
  h.add("kernel-text-v2")
      .add(header_for_hash(find_header_block(source).text))
      .add(kernel_code_for_hash(source));
  for (const IncludedHeader& header : included_project_headers(source, path))
    h.add(header.name).add(kernel_code_for_hash(header.text));
  return h.hex();
}

}  // namespace kforge
