// Five-stage checks of a tuned table's variants in other dtypes (`kforge check --table`, and
// `kforge tune --sizes all --check-dtypes`): a dtype of the same width borrows a table's row only
// once the row's variant has passed there (src/tune/library.h).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "cli/common.h"

namespace kforge {

struct TableCheckOptions {
  uint64_t seed = 0;  // 0: a fresh seed per check
  std::string arch;
  double timeout_seconds = 0;  // 0: the checker's default
  bool keep = false;
  // Compile every variant (CUDA files, for `arch` or sm_90a) and report the compiler's verdicts:
  // no device, no checks run, nothing recorded.
  bool compile_only = false;
};

// Checks every distinct variant of the table at `table` in each of `dtypes` (variants already
// checked there in the file's current text are skipped), records each result in the table's rows
// and prints one line per variant and dtype. Returns the number of checks that failed. With
// `options.compile_only`, compiles them instead and returns the number that did not compile.
int check_table_variants(const std::filesystem::path& table, const std::vector<DType>& dtypes,
                         const DeviceFlags& device, const TableCheckOptions& options);

}  // namespace kforge
