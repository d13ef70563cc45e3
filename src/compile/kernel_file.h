// A kernel file: its parsed header block and its source text (see docs/kernel-format.md).
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compile/expression.h"
#include "core/dtype.h"

namespace kforge {

enum class Backend { cuda, cpu };
std::string_view backend_name(Backend backend);

using ParamValues = std::map<std::string, long long, std::less<>>;

struct TunableParam {
  std::string name;
  // The default: a number, or an expression of `elem_bytes` (`16 / elem_bytes`) where the best
  // start differs by dtype (a 16-byte pack is 8 bf16 elements but 4 f32 ones).
  long long default_value = 0;
  std::optional<Expression> default_expression;
  std::vector<long long> candidates;
  int line = 0;

  long long default_for(long long elem_bytes) const;
};

struct DerivedValue {
  std::string name;
  Expression expression;
  int line = 0;
};

// `require:` must hold for a variant to be valid. `prune:` only narrows the tuner's search (a
// variant that breaks it is correct, just not worth timing at that size), so a variant asked
// for by name (defaults, --param, a table row) is never refused for it.
struct Requirement {
  Expression expression;
  int line = 0;
  bool pruning_only = false;
};

struct KernelFile {
  std::filesystem::path path;
  std::string source;
  // The hash of the code it compiles from: its header block, its code and the code of the
  // project headers it includes, comments aside (kernel_text_hash). What a check or a timing of
  // the file stands for.
  std::string text_hash;
  std::string op;
  Backend backend = Backend::cuda;
  std::vector<DType> dtypes;
  std::vector<TunableParam> params;
  std::vector<DerivedValue> derived;
  std::vector<Requirement> requirements;
  std::optional<Expression> shared_bytes;    // dynamic shared memory per block, in bytes
  std::optional<Expression> block_threads;   // threads per block of the main kernel
  std::optional<Expression> cluster_blocks;  // thread-block cluster size (1: no cluster)
  int min_occupancy_percent = 0;             // theoretical occupancy below this is pruned
  // `busy:` the work the busiest SM does at a problem, in any unit the file likes (the problem's
  // sizes, tunables, derived values and the device's limits bound): a variant's time is taken
  // to scale with it from one problem to another. The library uses it to choose, for a size
  // without a table row, the row whose variant is predicted fastest there (library.h). It
  // changes nothing that is compiled or checked, so it does not count in text_hash. A file
  // whose call runs kernels one after another may give one line per kernel: they add up.
  std::vector<Expression> busy;
  // `let: NAME = EXPRESSION`: a named value for the busy: lines alone, in order. Unlike a
  // derive, it may use the problem's sizes, since it never reaches the compiler; like busy:, it
  // does not count in text_hash. (A name and an expression, as a derive is; never compiled.)
  std::vector<DerivedValue> busy_lets;
  std::vector<std::string> libraries;  // header libraries it includes (`uses:`): "cutlass"

  // Reads and parses a file; throws UsageError if unreadable, ParseError if malformed.
  static KernelFile load(const std::filesystem::path& path);
  // Parses text; `path` is used for messages, to check the extension against `backend` and to
  // find the project headers the text includes (text_hash); throws Error if one of those cannot
  // be read.
  static KernelFile parse(const std::string& text, const std::filesystem::path& path);

  bool supports(DType dtype) const;
  bool uses(std::string_view library) const;
  // Every parameter at its default for `dtype`, with `overrides` applied. Throws UsageError for
  // an unknown name.
  ParamValues resolve_params(DType dtype, const ParamValues& overrides = {}) const;
  // Parameters plus derived values, in declaration order of evaluation.
  ParamValues with_derived(const ParamValues& params, const Bindings& context) const;
};

// The kforge header block of a kernel file's text as the header parser reads it: the lines from
// the first that starts with "/* kforge" through the first that closes it with "*/".
struct HeaderBlock {
  std::string text;    // those lines as written; empty when no line opens a block
  int first_line = 0;  // 1-based line of "/* kforge"; 0 when none
  bool closed = false;
};
HeaderBlock find_header_block(const std::string& text);
// A header block's text without its `busy:` and `let:` lines, read as the parser reads its keys:
// they only guide the library's choice between variants that are checked already
// (KernelFile::busy), so they do not count in what a check covers (kernel_text_hash).
std::string header_for_hash(const std::string& header);

// Parses "NAME=VALUE" as given on the command line.
std::pair<std::string, long long> parse_param_assignment(const std::string& text);

}  // namespace kforge
