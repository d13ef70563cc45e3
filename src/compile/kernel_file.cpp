#include "compile/kernel_file.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "compile/kernel_text.h"
#include "core/error.h"

namespace kforge {
namespace {

// The line that opens a kernel file's header block starts with this.
constexpr std::string_view kHeaderOpening = "/* kforge";

std::string trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return "";
  const auto last = s.find_last_not_of(" \t\r");
  return std::string(s.substr(first, last - first + 1));
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const auto pos = s.find(sep, start);
    parts.push_back(trim(s.substr(start, pos - start)));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return parts;
}

// A header line as the parser reads it: without the block's opening (on its first line), the
// closing "*/", the leading '*' and blank space. Empty, or a '#' comment, for a line it skips.
std::string header_line_body(std::string_view line, bool first_line) {
  std::string body = trim(line);
  if (first_line) body = trim(std::string_view(body).substr(kHeaderOpening.size()));
  if (const size_t close = body.find("*/"); close != std::string::npos)
    body = trim(body.substr(0, close));
  if (!body.empty() && body[0] == '*') body = trim(body.substr(1));
  return body;
}

bool parse_integer(const std::string& text, long long* out) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end && !text.empty();
}

bool is_upper_identifier(const std::string& s) {
  static const std::regex pattern("[A-Z][A-Z0-9_]*");
  return std::regex_match(s, pattern);
}

class HeaderParser {
 public:
  HeaderParser(KernelFile& file, std::string path) : file_(file), path_(std::move(path)) {}

  void parse(const std::string& text) {
    const HeaderBlock block = find_header_block(text);
    if (block.first_line == 0)
      fail(1, "no header block: a kernel file starts with a '/* kforge' comment");
    header_line_ = block.first_line;
    if (!block.closed) fail(header_line_, "header block is not closed with '*/'");
    std::istringstream in(block.text);
    std::string line;
    for (int line_no = block.first_line; std::getline(in, line); ++line_no) {
      const std::string body = header_line_body(line, line_no == block.first_line);
      if (!body.empty() && body[0] != '#') parse_line(body, line_no);
    }
    check_complete();
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const {
    throw ParseError(path_, line, what);
  }

  void parse_line(const std::string& body, int line) {
    const auto colon = body.find(':');
    if (colon == std::string::npos)
      fail(line, fmt::format("expected 'key: value', got '{}'", body));
    const std::string key = trim(body.substr(0, colon));
    const std::string value = trim(body.substr(colon + 1));
    if (value.empty()) fail(line, fmt::format("'{}' has no value", key));
    if (key == "op") {
      file_.op = value;
      op_line_ = line;
    } else if (key == "backend") {
      if (value == "cuda") {
        file_.backend = Backend::cuda;
      } else if (value == "cpu") {
        file_.backend = Backend::cpu;
      } else {
        fail(line, fmt::format("backend '{}' is not 'cuda' or 'cpu'", value));
      }
      backend_line_ = line;
    } else if (key == "dtypes") {
      for (const auto& name : split(value, ',')) {
        const auto dtype = parse_dtype(name);
        if (!dtype || !is_floating(*dtype) || *dtype == DType::f64) {
          fail(line, fmt::format("dtype '{}' is not one of f16, bf16, f32", name));
        }
        file_.dtypes.push_back(*dtype);
      }
    } else if (key == "param") {
      parse_param(value, line);
    } else if (key == "derive") {
      file_.derived.push_back(named_value(key, value, line));
    } else if (key == "require" || key == "prune") {
      file_.requirements.push_back({make_expression(value, line), line, key == "prune"});
    } else if (key == "shared_bytes") {
      set_once(file_.shared_bytes, key, value, line);
    } else if (key == "threads") {
      set_once(file_.block_threads, key, value, line);
    } else if (key == "cluster") {
      set_once(file_.cluster_blocks, key, value, line);
    } else if (key == "busy") {
      file_.busy.push_back(make_expression(value, line));
    } else if (key == "let") {
      file_.busy_lets.push_back(named_value(key, value, line));
    } else if (key == "min_occupancy") {
      long long percent = 0;
      if (!parse_integer(value, &percent) || percent < 1 || percent > 100) {
        fail(line, fmt::format("min_occupancy: expected a percentage 1..100, got '{}'", value));
      }
      file_.min_occupancy_percent = static_cast<int>(percent);
    } else if (key == "uses") {
      for (const auto& library : split(value, ',')) {
        if (library != "cutlass") {
          fail(line, fmt::format("uses: '{}' is not a library kforge provides (cutlass)", library));
        }
        file_.libraries.push_back(library);
        uses_line_ = line;
      }
    } else {
      fail(line, fmt::format("unknown key '{}' (expected op, backend, dtypes, param, derive, "
                             "require, prune, shared_bytes, threads, cluster, busy, let, "
                             "min_occupancy, uses)",
                             key));
    }
  }

  void set_once(std::optional<Expression>& slot, const std::string& key, const std::string& value,
                int line) {
    if (slot) fail(line, fmt::format("'{}' is given twice", key));
    slot = make_expression(value, line);
  }

  // param: NAME = DEFAULT in {V1, V2, ...}; DEFAULT is an integer or an expression of
  // elem_bytes, checked against the candidates for every declared dtype in check_complete().
  void parse_param(const std::string& value, int line) {
    static const std::regex pattern(R"(^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.+?)\s+in\s+\{(.*)\}$)");
    std::smatch m;
    if (!std::regex_match(value, m, pattern)) {
      fail(line,
           fmt::format("param: expected 'NAME = DEFAULT in {{V1, V2, ...}}', got '{}'", value));
    }
    TunableParam param;
    param.name = m[1];
    param.line = line;
    check_new_name(param.name, line);
    if (!parse_integer(m[2], &param.default_value)) {
      param.default_expression = make_expression(m[2], line);
      for (const auto& name : param.default_expression->variables()) {
        if (name != "elem_bytes") {
          fail(line, fmt::format("param {}: a default may depend on elem_bytes only, not '{}'",
                                 param.name, name));
        }
      }
    }
    for (const auto& item : split(std::string(m[3]), ',')) {
      long long v = 0;
      if (!parse_integer(item, &v)) {
        fail(line, fmt::format("param {}: candidate '{}' is not an integer", param.name, item));
      }
      if (std::find(param.candidates.begin(), param.candidates.end(), v) !=
          param.candidates.end()) {
        fail(line, fmt::format("param {}: candidate {} is listed twice", param.name, v));
      }
      param.candidates.push_back(v);
    }
    if (!param.default_expression) check_default(param, param.default_value, "");
    file_.params.push_back(std::move(param));
  }

  void check_default(const TunableParam& param, long long value, std::string_view dtype) const {
    if (std::find(param.candidates.begin(), param.candidates.end(), value) !=
        param.candidates.end()) {
      return;
    }
    fail(param.line, fmt::format("param {}: default {}{} is not one of {{{}}}", param.name, value,
                                 dtype.empty() ? "" : fmt::format(" (in {})", dtype),
                                 fmt::join(param.candidates, ", ")));
  }

  // A default that depends on the dtype must be a candidate in each one the file declares.
  void check_dtype_defaults() const {
    for (const auto& param : file_.params) {
      if (!param.default_expression) continue;
      for (const DType dtype : file_.dtypes) {
        long long value = 0;
        try {
          value = param.default_for(static_cast<long long>(dtype_size(dtype)));
        } catch (const Error& e) {
          fail(param.line, fmt::format("param {}: {}", param.name, e.what()));
        }
        check_default(param, value, dtype_name(dtype));
      }
    }
  }

  // A `derive:` or `let:` line's `NAME = EXPRESSION`.
  DerivedValue named_value(const std::string& key, const std::string& value, int line) {
    const auto eq = value.find('=');
    if (eq == std::string::npos) fail(line, fmt::format("{}: expected 'NAME = EXPRESSION'", key));
    const std::string name = trim(value.substr(0, eq));
    check_new_name(name, line);
    return {name, make_expression(value.substr(eq + 1), line), line};
  }

  void check_new_name(const std::string& name, int line) {
    if (!is_upper_identifier(name)) {
      fail(line, fmt::format("'{}' is not an upper-case identifier (A-Z, 0-9, _)", name));
    }
    for (const auto& p : file_.params) {
      if (p.name == name)
        fail(line, fmt::format("'{}' is already declared on line {}", name, p.line));
    }
    for (const auto* values : {&file_.derived, &file_.busy_lets}) {
      for (const auto& d : *values) {
        if (d.name == name)
          fail(line, fmt::format("'{}' is already declared on line {}", name, d.line));
      }
    }
  }

  Expression make_expression(const std::string& text, int line) const {
    try {
      return Expression(trim(text));
    } catch (const Error& e) {
      fail(line, e.what());
    }
  }

  void check_complete() {
    if (file_.op.empty()) fail(header_line_, "header block has no 'op:' line");
    if (backend_line_ == 0) fail(header_line_, "header block has no 'backend:' line");
    if (file_.dtypes.empty()) fail(header_line_, "header block has no 'dtypes:' line");
    const auto ext = std::filesystem::path(path_).extension().string();
    const Backend expected = ext == ".cu" ? Backend::cuda : Backend::cpu;
    if ((ext == ".cu" || ext == ".cpp") && expected != file_.backend) {
      fail(backend_line_, fmt::format("backend '{}' does not match the file extension '{}'",
                                      backend_name(file_.backend), ext));
    }
    if (!file_.libraries.empty() && file_.backend != Backend::cuda) {
      fail(uses_line_, "uses: CUTLASS is for CUDA files");
    }
    check_dtype_defaults();
  }

  KernelFile& file_;
  std::string path_;
  int header_line_ = 1;
  int op_line_ = 0;
  int backend_line_ = 0;
  int uses_line_ = 0;
};

}  // namespace

std::string_view backend_name(Backend backend) {
  return backend == Backend::cuda ? "cuda" : "cpu";
}

KernelFile KernelFile::load(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(fmt::format("cannot read kernel file '{}'", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

HeaderBlock find_header_block(const std::string& text) {
  HeaderBlock block;
  size_t begin = 0;
  for (int line_no = 1; begin < text.size(); ++line_no) {
    const size_t newline = text.find('\n', begin);
    const size_t end = newline == std::string::npos ? text.size() : newline + 1;
    const std::string_view line = std::string_view(text).substr(begin, end - begin);
    begin = end;
    size_t close_from = 0;  // "*/" closes the block from here on this line
    if (block.first_line == 0) {
      const size_t first = line.find_first_not_of(" \t\r");
      if (first == std::string_view::npos || !line.substr(first).starts_with(kHeaderOpening))
        continue;
      block.first_line = line_no;
      close_from = first + kHeaderOpening.size();
    }
    block.text += line;
    if (line.find("*/", close_from) != std::string_view::npos) {
      block.closed = true;
      break;
    }
  }
  return block;
}

std::string header_for_hash(const std::string& header) {
  std::string kept;
  size_t begin = 0;
  for (bool first = true; begin < header.size(); first = false) {
    const size_t newline = header.find('\n', begin);
    const size_t end = newline == std::string::npos ? header.size() : newline + 1;
    const std::string_view line = std::string_view(header).substr(begin, end - begin);
    begin = end;
    const std::string body = header_line_body(line, first);
    const size_t colon = body.find(':');
    if (!body.starts_with('#') && colon != std::string::npos) {
      const std::string key = trim(std::string_view(body).substr(0, colon));
      if (key == "busy" || key == "let") continue;
    }
    kept += line;
  }
  return kept;
}

KernelFile KernelFile::parse(const std::string& text, const std::filesystem::path& path) {
  KernelFile file;
  file.path = path;
  file.source = text;
  file.text_hash = kernel_text_hash(text, path);
  HeaderParser(file, path.string()).parse(text);
  return file;
}

bool KernelFile::supports(DType dtype) const {
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

bool KernelFile::uses(std::string_view library) const {
  return std::find(libraries.begin(), libraries.end(), library) != libraries.end();
}

long long TunableParam::default_for(long long elem_bytes) const {
  if (!default_expression) return default_value;
  return default_expression->evaluate({{"elem_bytes", elem_bytes}});
}

ParamValues KernelFile::resolve_params(DType dtype, const ParamValues& overrides) const {
  ParamValues values;
  for (const auto& p : params)
    values[p.name] = p.default_for(static_cast<long long>(dtype_size(dtype)));
  for (const auto& [name, value] : overrides) {
    if (!values.contains(name)) {
      std::vector<std::string> names;
      for (const auto& p : params)
        names.push_back(p.name);
      throw UsageError(
          fmt::format("{} has no parameter '{}' (it has: {})", path.string(), name,
                      names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "))));
    }
    values[name] = value;
  }
  return values;
}

ParamValues KernelFile::with_derived(const ParamValues& params_in, const Bindings& context) const {
  ParamValues values = params_in;
  Bindings bindings = context;
  for (const auto& [name, value] : params_in)
    bindings[name] = value;
  for (const auto& d : derived) {
    const long long v = d.expression.evaluate(bindings);
    values[d.name] = v;
    bindings[d.name] = v;
  }
  return values;
}

std::pair<std::string, long long> parse_param_assignment(const std::string& text) {
  const auto eq = text.find('=');
  long long value = 0;
  if (eq == std::string::npos || !parse_integer(trim(text.substr(eq + 1)), &value)) {
    throw UsageError(fmt::format("--param '{}': expected NAME=INTEGER", text));
  }
  return {trim(text.substr(0, eq)), value};
}

}  // namespace kforge
