// The op library: which kernel file and parameters kforge runs for a problem.
//
// An op's library is its kernel files (kernels/<op>/*.cu for CUDA, *.cpp for the CPU) plus the
// size -> variant tables that `kforge tune --sizes all` writes to kernels/<op>/tuned/, one per
// dtype and device. A problem gets, in order of preference:
//   1. the table row for its exact sizes (tuned for this problem on this device);
//   2. the table row of the nearest tuned size (sizes compared on a log scale), when that
//      variant's requirements hold at the new sizes; where every such row's file has a `busy:`
//      line (how much work its busiest SM does at a problem), the row whose measured time,
//      scaled to the new sizes by it, is the shortest;
//   3. the defaults of the op's starter file (device_starter: one that can run on the device).
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

// The library's table of `op` for the device `device_key` in `dtype`, else in the dtype of the
// same width (f16 <-> bf16): where it is and which dtype it was tuned in. Nothing when neither
// exists.
struct TableLocation {
  std::filesystem::path path;
  DType dtype = DType::bf16;
};
std::optional<TableLocation> find_tuned_table(const std::string& op, DType dtype,
                                              const std::string& device_key);

// A size -> variant table: {op, dtype, device, strategy, git_sha, recorded_at, sizes: rows}, a
// row being {shape, sizes, file, params, variant_key, time_us, final_check, git_sha,
// recorded_at, tune_seconds?, evaluations?, adopted_from?, checks?}, or {shape, sizes, file:
// null} for a size where no variant passed. `adopted_from` names the device whose table's
// variant the row took (`kforge tune --adopt`), checked and timed on this one.
// `checks` holds five-stage checks of the row's variant in other dtypes: {dtype: {result, seed,
// git_sha, checked_at}}, result starting "PASS" or "FAIL".

// The table at `path`, parsed. Throws Error naming the path when it is not such a table.
nlohmann::json read_tuned_table(const std::filesystem::path& path);

// Writes `rows` as the table of `op` in `dtype` on `device` at `path` and returns the rows
// written. With `merge`, the rows of other sizes in the table already at `path` are kept (each
// of `rows` replaces the row of its size or is added after them); that table must be for the
// same op, dtype and device, else UsageError. A row written where the table at `path` (of the
// same op, dtype and device, merged or not) had one of the same variant at its size (file,
// parameters and file text) keeps the checks recorded there of that text.
nlohmann::json write_tuned_table(const std::filesystem::path& path, const OpSpec& op, DType dtype,
                                 const std::string& device, const std::string& strategy,
                                 const nlohmann::json& rows, bool merge);

// A row's params (a JSON object of names and integers) as values; nullopt when they are not.
std::optional<ParamValues> param_values(const nlohmann::json& params);

// Whether a row of a table for `table_dtype` may serve `dtype`: it passed its final check in the
// table's dtype, or it has a passing check recorded for `dtype` (kforge check --table's). Whether
// that check was of the file's present code is row_check_in_text's question.
bool row_serves_dtype(const nlohmann::json& row, DType table_dtype, DType dtype);

// Records a five-stage check `result` ("PASS ..." or "FAIL ...") of `dtype` in every row of the
// table at `path` that runs `file` (a file name) with exactly `params`, with `source_hash`, the
// hash of the code that was checked (KernelFile::text_hash: the file's text and the project
// headers it includes). The table is rewritten atomically. Returns the number of rows updated.
int record_table_check(const std::filesystem::path& path, const std::string& file,
                       const nlohmann::json& params, DType dtype, const std::string& result,
                       uint64_t seed, const std::string& source_hash);
// The same with a check record as a row holds it (result, seed, source_hash, git_sha,
// checked_at): one row's check copied to the other rows of its variant.
int record_table_check(const std::filesystem::path& path, const std::string& file,
                       const nlohmann::json& params, DType dtype, const nlohmann::json& check);

// The hash of the code (KernelFile::text_hash) a row's variant was tuned with (the first field
// of its variant_key); empty for a row without one.
std::string row_source_hash(const nlohmann::json& row);
// The text hash a row's check in `dtype` names: nullopt when the row has no such check, empty
// when the check names none (recorded before checks named one).
std::optional<std::string> row_check_text(const nlohmann::json& row, DType dtype);
// A row's check record in `dtype`, or null when it has none.
const nlohmann::json* row_check(const nlohmann::json& row, DType dtype);
// Whether a check record's result is a pass.
bool check_passed(const nlohmann::json& check);

// The check a row (of a table in `table_dtype`) holds in `dtype` of the code with hash
// `text_hash`, as a check record (result, source_hash and, where known, seed, git_sha and
// checked_at), or nullopt when it holds none. The checks that count are `kforge check --table`'s
// in `dtype` (the latest word on that code) and, in the table's own dtype, the final check of the
// tune that wrote the row, made on the code its variant key names: a PASS or a FAIL ("not
// checked (replay)" is none), recorded with the row's git_sha and recorded_at.
std::optional<nlohmann::json> row_check_of_code(const nlohmann::json& row, DType table_dtype,
                                                DType dtype, const std::string& text_hash);

// What a row records about `dtype` for its file's code `text_hash`: a check of that code passed
// or failed (row_check_of_code's), or none was made.
enum class CheckInText { passed, failed, none };
CheckInText row_check_in_text(const nlohmann::json& row, DType table_dtype, DType dtype,
                              const std::string& text_hash);

// "NVIDIA H200 (cc 9.0)" -> "NVIDIA-H200-cc-9-0": safe in a file name.
std::string file_name_slug(std::string text);

// How far apart two problems are for the nearest-row rule: over `a`'s size names, |log(a / b)|
// where both are positive (0 for equal problems, growing with every factor of difference); a
// name that is 0 or negative on either side (a flag such as causal, or 0 for "the default") adds
// nothing where the two agree and kOtherFlagDistance where they do not, more than any difference
// of dimensions, so a row with the same flags is always nearer. A name missing from `b` makes
// them unrelated (the largest double).
inline constexpr double kOtherFlagDistance = 1000.0;
double size_distance(const Sizes& a, const Sizes& b);

struct LibraryChoice {
  std::filesystem::path file;
  ParamValues params;  // the tunables to compile with; missing ones take the file's defaults
  enum class Source { exact_size, nearest_size, defaults } source = Source::defaults;
  std::string tuned_shape;                // the table row used, for exact/nearest
  std::optional<double> tuned_median_us;  // its time when it was tuned
  // For a size without a row: the row's time scaled to this size by its file's busy: line, when
  // that prediction chose the row among several (library_choice).
  std::optional<double> predicted_us;
  // Every row weighed by that prediction, nearest first: what each was predicted to take here.
  struct WeighedRow {
    std::string tuned_shape;
    double tuned_median_us = 0;
    double predicted_us = 0;
  };
  std::vector<WeighedRow> weighed;
  std::filesystem::path table;         // the table consulted, if any
  std::optional<DType> borrowed_from;  // the table's dtype, when it is not the problem's
  std::string adopted_from;            // the device whose table's rows this device's table adopted
  // The row's check in this dtype was made on the file's present text (library_choice skips a
  // row whose check there failed; one checked only on an earlier text is used, and says so).
  bool checked_in_present_text = false;

  // The device has no table for the op in this dtype (nor one of the same width): the run
  // gets the starter's defaults, which are no tuned result (untuned_offer says what to do).
  bool untuned_device() const { return source == Source::defaults && table.empty(); }
  // "tuned at 8192x8192", "tuned at 4096x4096 (nearest)", "defaults (no table for ...)"; a row
  // not checked in its file's present text says so.
  std::string describe() const;
  nlohmann::json to_json() const;
};

// The op's starter file for `dtype` on `device`: starter_kernel's, where its defaults can run
// there, else the first of the op's library files (by name) whose defaults can (another GPU than
// the one a Hopper-only wgmma starter needs, say); the starter itself where none can, so that
// the error names it. "Can run": the file declares the dtype and no requirement or launch limit
// that the device alone decides fails.
std::filesystem::path device_starter(const OpSpec& op, DType dtype, const DeviceInfo& device);

// What is wrong with `file`'s busy: and let: lines for `op`, or "": a let: value named as one of
// the op's sizes (it would replace the size), or a name that is no size, device limit, tunable,
// derived value or earlier let: value (it would leave the lines unbound at every size, and the
// library would quietly take the nearest row). library_choice throws Error on it.
std::string busy_lines_problem(const KernelFile& file, const OpSpec& op);

// The file's `busy:` value for the variant `params` (tunables as a table row names them) at
// `sizes` on `device`, its lines summed; nothing when the file has no such line, a line names
// something unbound, or the sum is not positive. library_choice checks the lines first with
// busy_lines_problem.
std::optional<double> busy_at(const KernelFile& file, const ParamValues& params, const Sizes& sizes,
                              DType dtype, const DeviceInfo& device);

// The library's variant for `sizes` in `dtype` on `device`.
LibraryChoice library_choice(const OpSpec& op, const Sizes& sizes, DType dtype,
                             const DeviceInfo& device);

// "9.0" from a CUDA device key "NVIDIA H200 (cc 9.0)"; empty for any other key.
std::string compute_capability_of(const std::string& device_key);

// A table of an op tuned on another device of the same architecture (the same compute
// capability: the H200's for an H100). Such a table is a starting point, never a result: its
// variants are valid here, but their speed is not known until they are timed here.
struct SameArchitectureTable {
  std::filesystem::path path;
  nlohmann::json table;  // as read from `path`
  std::string device;    // the device key it was tuned on
  DType dtype = DType::bf16;
  size_t rows = 0;          // sizes with a variant
  size_t variants = 0;      // distinct variants among them
  double tune_seconds = 0;  // the tune's wall time, summed over rows that recorded it
  size_t evaluations = 0;   // evaluations, summed over the same rows
};

// Tables of `op` for other CUDA devices with `device`'s compute capability, in `dtype` first,
// then in the dtype of the same width; this device's own tables are not among them.
std::vector<SameArchitectureTable> same_architecture_tables(const std::string& op, DType dtype,
                                                            const DeviceInfo& device);

// The row of `table` with a variant whose sizes are nearest `sizes` (on a log scale), or null.
const nlohmann::json* nearest_table_row(const nlohmann::json& table, const Sizes& sizes);

// What a user is told when `device` has no table for `op` in `dtype`: that the run gets the
// starter's untuned defaults, and the two ways out with their cost: tune every sweep size now,
// or adopt the table of a device of the same architecture after checking and timing its
// variants here. Empty when `choice` came from a table.
std::string untuned_offer(const OpSpec& op, DType dtype, const DeviceInfo& device,
                          const LibraryChoice& choice);

// Evaluations per sweep size that the offer proposes for a tune of every size.
inline constexpr int kOfferedTuneBudget = 24;

}  // namespace kforge
