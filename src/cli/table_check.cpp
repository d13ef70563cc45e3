#include "cli/table_check.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "compile/compiler.h"
#include "compile/variant.h"
#include "core/error.h"
#include "device/launch_limits.h"
#include "tune/library.h"

namespace kforge {
namespace {

// "FAIL (COMPILE_ERROR)" from a recorded result "FAIL (COMPILE_ERROR): the compiler's output".
std::string failure_of(const nlohmann::json& check) {
  const std::string result = check.value("result", std::string("FAIL"));
  return result.substr(0, result.find(':'));
}

// check --table --compile-only: each variant (file and the tunables its rows name) compiled in
// each of `dtypes` for `arch` (default sm_90a), no device needed, nothing recorded. Prints a line
// per variant (with ptxas's note where it serializes the variant's wgmma) and returns how many
// were rejected by their file's rules or did not compile.
int compile_table_variants(const std::filesystem::path& table_path,
                           const std::vector<std::pair<const KernelFile*, ParamValues>>& variants,
                           const std::vector<DType>& dtypes, const std::string& arch_option) {
  const std::string arch = arch_option.empty() ? "sm_90a" : arch_option;
  std::vector<std::pair<const KernelFile*, Variant>> work;
  std::vector<std::string> rejected;
  for (const auto& [file, named_params] : variants) {
    for (const DType dtype : dtypes) {
      if (!file->supports(dtype)) continue;
      // Derived values that need a device's limits would fail here: none of the library's do.
      Bindings bindings = {{"elem_bytes", static_cast<long long>(dtype_size(dtype))}};
      const ParamValues params =
          file->with_derived(file->resolve_params(dtype, named_params), bindings);
      const Variant variant = Variant::make(*file, params, dtype, arch);
      for (const auto& [param, value] : params)
        bindings[param] = value;
      if (const Requirement* broken = first_broken_requirement(*file, bindings)) {
        rejected.push_back(fmt::format("{} (require '{}', line {})", variant.describe(),
                                       broken->expression.text(), broken->line));
      } else {
        work.emplace_back(file, variant);
      }
    }
  }
  progress_line(fmt::format("compiling the {} variants of {} for {}", work.size(),
                            table_path.string(), arch));
  const std::vector<CompileResult> built = Compiler().compile_all(work);
  int failed = static_cast<int>(rejected.size());
  fmt::print("\n{} ({} variants, compiled for {}):\n", table_path.string(), variants.size(), arch);
  for (const std::string& line : rejected)
    fmt::print("  {:<13} {}\n", "REJECTED", line);
  for (const CompileResult& r : built) {
    if (!r.ok) ++failed;
    // A row that compiles with its wgmma serialized runs far below its speed: said, not counted.
    const std::string serialized = r.ok ? r.resources.serialized_wgmma() : std::string();
    fmt::print(
        "  {:<13} {}{}\n", r.ok ? "COMPILES" : "COMPILE_ERROR", r.variant.describe(),
        serialized.empty() ? "" : fmt::format(" (ptxas serializes its wgmma: {})", serialized));
    if (!r.ok) fmt::print("{}\n", r.log);
  }
  return failed;
}

}  // namespace

int check_table_variants(const std::filesystem::path& table_path, const std::vector<DType>& dtypes,
                         const DeviceFlags& device, const TableCheckOptions& options) {
  const nlohmann::json table = read_tuned_table(table_path);
  const std::string op = table.value("op", std::string());
  const nlohmann::json rows = table.at("sizes");
  // Distinct (file, params) pairs, in table order.
  std::vector<std::pair<std::string, nlohmann::json>> variants;
  for (const auto& row : rows) {
    if (!row.contains("file") || row.at("file").is_null()) continue;
    std::pair<std::string, nlohmann::json> v{row.at("file").get<std::string>(),
                                             row.value("params", nlohmann::json::object())};
    if (std::find(variants.begin(), variants.end(), v) == variants.end()) variants.push_back(v);
  }
  const std::vector<KernelFile> files =
      library_files(op, options.compile_only ? "cuda" : pick_backend(device, nullptr));
  const auto file_named = [&](const std::string& name) {
    const auto file = std::find_if(files.begin(), files.end(), [&](const KernelFile& f) {
      return f.path.filename().string() == name;
    });
    if (file == files.end())
      throw UsageError(fmt::format("{}: no library file {}", table_path.string(), name));
    return file;
  };
  const auto params_of = [&](const nlohmann::json& params_json) {
    const std::optional<ParamValues> params = param_values(params_json);
    if (!params) {
      throw UsageError(fmt::format("{}: a row's params are not names and integers: {}",
                                   table_path.string(), params_json.dump()));
    }
    return *params;
  };
  const auto rows_of = [&](const std::string& name, const nlohmann::json& params_json) {
    return [&, name, params_json](const nlohmann::json& row) {
      return row.value("file", nlohmann::json()) == name &&
             row.value("params", nlohmann::json::object()) == params_json;
    };
  };
  if (options.compile_only) {
    std::vector<std::pair<const KernelFile*, ParamValues>> named;
    for (const auto& [name, params_json] : variants)
      named.emplace_back(&*file_named(name), params_of(params_json));
    return compile_table_variants(table_path, named, dtypes, options.arch);
  }

  // What a check covers is the file's code as it was, with the project headers it includes
  // (KernelFile::text_hash): after an edit to the code of any of them, not to a comment, the
  // variant is checked again. The checks that count are this command's records and, in the
  // table's dtype, the final check of the tune that wrote a row (row_check_of_code). A variant
  // with a check of this code on every row of it is not checked again; one with a check on some
  // of its rows has that check copied to the others.
  const std::string table_dtype_name = table.value("dtype", std::string());
  const std::optional<DType> table_dtype = parse_dtype(table_dtype_name);
  if (!table_dtype) {
    throw UsageError(fmt::format("{}: not a tuned table: no dtype kforge knows (\"{}\")",
                                 table_path.string(), table_dtype_name));
  }
  // The checks of this code the variant's rows hold, and whether every row holds one.
  struct RowChecks {
    std::vector<nlohmann::json> checks;
    bool on_every_row = true;
  };
  const auto checks_of = [&](const auto& is_variant, DType dtype, const std::string& code) {
    RowChecks found;
    for (const auto& row : rows) {
      if (!is_variant(row)) continue;
      if (auto check = row_check_of_code(row, *table_dtype, dtype, code)) {
        found.checks.push_back(std::move(*check));
      } else {
        found.on_every_row = false;
      }
    }
    return found;
  };

  // Every variant that will run its five stages (no row of it holds a check of this code) is
  // compiled first, all at once.
  std::vector<Checker::BuildRequest> to_check;
  for (const auto& [name, params_json] : variants) {
    const KernelFile& file = *file_named(name);
    for (const DType dtype : dtypes) {
      if (checks_of(rows_of(name, params_json), dtype, file.text_hash).checks.empty())
        to_check.push_back({&file, file.resolve_params(dtype, params_of(params_json)), dtype});
    }
  }
  if (to_check.size() >= 2) {
    progress_line(fmt::format("compiling the {} variants to check at once", to_check.size()));
    KernelSession session(to_check.front().file->path.string(), device, options.keep);
    session.checker.prebuild(to_check, options.arch);
  }

  int failed = 0;
  std::vector<std::string> lines;
  for (size_t i = 0; i < variants.size(); ++i) {
    const auto& [name, params_json] = variants[i];
    KernelSession session(file_named(name)->path.string(), device, options.keep);
    const ParamValues params = params_of(params_json);
    const std::string& source_hash = session.file.text_hash;
    const auto is_variant = rows_of(name, params_json);
    for (const DType dtype : dtypes) {
      const RowChecks checked = checks_of(is_variant, dtype, source_hash);
      if (!checked.checks.empty()) {
        // A failed check of this code, if any, is the one that stands.
        const auto failing =
            std::find_if_not(checked.checks.begin(), checked.checks.end(), check_passed);
        const nlohmann::json& check =
            failing != checked.checks.end() ? *failing : checked.checks.front();
        if (!check_passed(check)) ++failed;
        const std::string verdict = check_passed(check) ? "PASS" : failure_of(check);
        if (checked.on_every_row) {
          lines.push_back(fmt::format("{:<5} {:<4} {} {}  (checked before)", verdict,
                                      dtype_name(dtype), name, params_json.dump()));
          continue;
        }
        // A check of this code on one row stands for the variant's other rows (a tune that
        // wrote the variant on another row, or replaced a row with it, left those unchecked):
        // it is copied to them, not run again.
        const int updated = record_table_check(table_path, name, params_json, dtype, check);
        lines.push_back(
            fmt::format("{:<5} {:<4} {} {}  ({} rows; the check of {} in this code, "
                        "copied)",
                        verdict, dtype_name(dtype), name, params_json.dump(), updated,
                        check.value("checked_at", std::string("an unknown date"))));
        continue;
      }
      const bool earlier_text = std::any_of(rows.begin(), rows.end(), [&](const auto& row) {
        const auto text = row_check_text(row, dtype);
        return is_variant(row) && text && *text != source_hash;
      });
      CheckOptions check;
      check.seed = options.seed;
      check.dtypes = {dtype};
      check.params = params;
      check.arch = options.arch;
      check.timeout =
          std::chrono::milliseconds(static_cast<long long>(options.timeout_seconds * 1000));
      progress_line(fmt::format("[{}/{}] {} {} {}", i + 1, variants.size(), name,
                                params_json.dump(), dtype_name(dtype)));
      const CheckReport report = session.checker.check(session.file, check, [](auto&&) {});
      const std::string result =
          report.passed()
              ? "PASS (five stages)"
              : fmt::format("FAIL ({}): {}", verdict_name(report.verdict), report.detail);
      if (!report.passed()) ++failed;
      const int updated = record_table_check(table_path, name, params_json, dtype, result,
                                             report.seed, source_hash);
      lines.push_back(
          fmt::format("{:<5} {:<4} {} {}  ({} rows{})",
                      report.passed() ? std::string("PASS")
                                      : fmt::format("FAIL ({})", verdict_name(report.verdict)),
                      dtype_name(dtype), name, params_json.dump(), updated,
                      earlier_text ? "; checked before in another text of the file" : ""));
    }
  }
  fmt::print("\n{} ({} variants):\n", table_path.string(), variants.size());
  for (const auto& line : lines)
    fmt::print("  {}\n", line);
  return failed;
}

}  // namespace kforge
