// The op library: which kernel file and parameters kforge runs for a problem.
//
// An op's library is its kernel files (kernels/<op>/*.cu for CUDA, *.cpp for the CPU) plus the
// size -> variant tables that `kforge tune --sizes all` writes to kernels/<op>/tuned/, one per
// dtype and device. A problem gets, in order of preference:
//   1. the table row for its exact sizes (tuned for this problem on this device);
//   2. the table row of the nearest tuned size (sizes compared on a log scale), when that
//      variant's requirements hold at the new sizes;
//   3. the defaults of the op's starter file.
// Every library variant is correct at every size (the files' own fallbacks see to it), so a
// choice only ever costs speed, never correctness.
//
// A dtype without a table of its own borrows the table of the dtype with the same element size
// (f16 <-> bf16: the same bytes move, so the same tuning applies), using only the rows whose
// variant `kforge check --table` has checked in the borrowing dtype (the row's "checks").
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compile/kernel_file.h"
#include "device/backend.h"
#include "ops/op_spec.h"

namespace kforge {

// Every library kernel file of `op` for `backend` ("cuda" or "cpu"), sorted by path. Throws
// UsageError when there is none or a file implements another op.
std::vector<KernelFile> library_files(const std::string& op, const std::string& backend);

// Where `kforge tune --sizes all` keeps an op's table for a dtype and device, and where the
// library looks for it.
std::filesystem::path tuned_table_path(const std::string& op, DType dtype,
                                       const std::string& device_key);

// A size -> variant table: {op, dtype, device, strategy, git_sha, recorded_at, sizes: rows}, a
// row being {shape, sizes, file, params, variant_key, time_us, final_check, git_sha,
// recorded_at, checks?}, or {shape, sizes, file: null} for a size where no variant passed.
// `checks` holds five-stage checks of the row's variant in other dtypes: {dtype: {result, seed,
// git_sha, checked_at}}, result starting "PASS" or "FAIL".

// The table at `path`, parsed. Throws Error naming the path when it is not such a table.
nlohmann::json read_tuned_table(const std::filesystem::path& path);

// Writes `rows` as the table of `op` in `dtype` on `device` at `path` and returns the rows
// written. With `merge`, the rows of other sizes in the table already at `path` are kept (each
// of `rows` replaces the row of its size or is added after them); that table must be for the
// same op, dtype and device, else UsageError.
nlohmann::json write_tuned_table(const std::filesystem::path& path, const OpSpec& op, DType dtype,
                                 const std::string& device, const std::string& strategy,
                                 const nlohmann::json& rows, bool merge);

// Whether a row of a table for `table_dtype` may serve `dtype`: it passed its final check in the
// table's dtype, or it has a passing check recorded for `dtype`.
bool row_serves_dtype(const nlohmann::json& row, DType table_dtype, DType dtype);

// Records a five-stage check `result` ("PASS ..." or "FAIL ...") of `dtype` in every row of the
// table at `path` that runs `file` (a file name) with exactly `params`. The table is rewritten
// atomically. Returns the number of rows updated.
int record_table_check(const std::filesystem::path& path, const std::string& file,
                       const nlohmann::json& params, DType dtype, const std::string& result,
                       uint64_t seed);

// "NVIDIA H200 (cc 9.0)" -> "NVIDIA-H200-cc-9-0": safe in a file name.
std::string file_name_slug(std::string text);

struct LibraryChoice {
  std::filesystem::path file;
  ParamValues params;  // the tunables to compile with; missing ones take the file's defaults
  enum class Source { exact_size, nearest_size, defaults } source = Source::defaults;
  std::string tuned_shape;                // the table row used, for exact/nearest
  std::optional<double> tuned_median_us;  // its time when it was tuned
  std::filesystem::path table;            // the table consulted, if any
  std::optional<DType> borrowed_from;     // the table's dtype, when it is not the problem's

  // "tuned at 8192x8192", "tuned at 4096x4096 (nearest)", "defaults (no table for ...)".
  std::string describe() const;
  nlohmann::json to_json() const;
};

// The library's variant for `sizes` in `dtype` on `device`.
LibraryChoice library_choice(const OpSpec& op, const Sizes& sizes, DType dtype,
                             const DeviceInfo& device);

}  // namespace kforge
