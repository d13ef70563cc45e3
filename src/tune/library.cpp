#include "tune/library.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "compile/compiler.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/run_info.h"
#include "device/launch_limits.h"
#include "tune/results_db.h"

namespace kforge {

namespace fs = std::filesystem;

std::vector<KernelFile> library_files(const std::string& op, const std::string& backend) {
  const fs::path dir = library_kernels_dir() / op;
  std::vector<fs::path> paths;
  if (fs::is_directory(dir)) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      const auto ext = entry.path().extension();
      if ((backend == "cuda" && ext == ".cu") || (backend == "cpu" && ext == ".cpp")) {
        paths.push_back(entry.path());
      }
    }
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) {
    throw UsageError(fmt::format("no {} kernel files for {} in {}", backend, op, dir.string()));
  }
  std::vector<KernelFile> files;
  for (const auto& p : paths) {
    files.push_back(KernelFile::load(p));
    if (files.back().op != op) {
      throw UsageError(
          fmt::format("{} implements '{}', not '{}'", p.string(), files.back().op, op));
    }
  }
  return files;
}

std::string file_name_slug(std::string text) {
  // Letters and digits kept; every run of anything else becomes one '-', none at the ends.
  std::string out;
  for (const char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      out += c;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  if (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

fs::path tuned_table_path(const std::string& op, DType dtype, const std::string& device_key) {
  return library_kernels_dir() / op / "tuned" /
         fmt::format("{}-{}.json", dtype_name(dtype), file_name_slug(device_key));
}

nlohmann::json read_tuned_table(const fs::path& path) {
  try {
    std::ifstream in(path);
    nlohmann::json table = nlohmann::json::parse(in);
    if (!table.is_object() || !table.value("sizes", nlohmann::json()).is_array()) {
      throw Error(fmt::format("{}: not a tuned table: no \"sizes\" array", path.string()));
    }
    return table;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not a tuned table: {}", path.string(), e.what()));
  }
}

std::optional<ParamValues> param_values(const nlohmann::json& params) {
  if (!params.is_object()) return std::nullopt;
  ParamValues values;
  for (const auto& [name, value] : params.items()) {
    if (!value.is_number_integer()) return std::nullopt;
    values[name] = value.get<long long>();
  }
  return values;
}

namespace {

// The text hash a check entry names; empty for one that names none (or is malformed).
std::string check_source_hash(const nlohmann::json& check) {
  if (!check.is_object()) return "";
  const auto hash = check.find("source_hash");
  return hash != check.end() && hash->is_string() ? hash->get<std::string>() : "";
}

// A row's checks, by dtype name; null when it has none (or they are malformed).
const nlohmann::json* row_checks(const nlohmann::json& row) {
  const auto checks = row.find("checks");
  return checks != row.end() && checks->is_object() ? &*checks : nullptr;
}

// The op's library file that `row` runs, if its code is `text`: only that file's defaults may
// fill in what a row's params leave out. nullopt when there is none or it no longer loads.
std::optional<KernelFile> library_file_of_text(const std::string& op, const nlohmann::json& row,
                                               const std::string& text) {
  const fs::path path = library_kernels_dir() / op / row.value("file", std::string());
  if (!fs::is_regular_file(path)) return std::nullopt;
  try {
    KernelFile file = KernelFile::load(path);
    if (file.text_hash == text) return file;
  } catch (const Error&) {
  }
  return std::nullopt;
}

// Whether params `a` and `b` (as rows write them) name the same variant of `file` in `dtype`,
// its defaults filling in what either leaves out (a row written before a tunable existed does
// not name it).
bool same_resolved_params(const KernelFile& file, const nlohmann::json& a, const nlohmann::json& b,
                          DType dtype) {
  const auto a_values = param_values(a), b_values = param_values(b);
  if (!a_values || !b_values) return false;
  try {
    return file.resolve_params(dtype, *a_values) == file.resolve_params(dtype, *b_values);
  } catch (const Error&) {
    return false;  // a name the file does not have
  }
}

// `row` with the checks of `old` (the row it replaces) that cover the same variant and file text
// and that `row` does not have itself. In the table's dtype (`table_dtype`) the row's own final
// check is the newer word, so an older check there is not kept.
nlohmann::json with_checks_kept(const std::string& op, const nlohmann::json& row,
                                const nlohmann::json& old, DType table_dtype) {
  const std::string text = row_source_hash(row);
  const nlohmann::json* old_checks = row_checks(old);
  if (text.empty() || !old_checks ||
      row.value("file", nlohmann::json()) != old.value("file", nlohmann::json())) {
    return row;
  }
  const nlohmann::json params = row.value("params", nlohmann::json());
  const nlohmann::json old_params = old.value("params", nlohmann::json());
  // Params written differently may still name the same variant; the file is read only then.
  const bool same_as_written = params == old_params;
  const std::optional<KernelFile> file =
      same_as_written ? std::nullopt : library_file_of_text(op, row, text);
  if (!same_as_written && !file) return row;
  nlohmann::json kept = row;
  for (const auto& [name, check] : old_checks->items()) {
    const std::optional<DType> dtype = parse_dtype(name);
    if (check_source_hash(check) != text || name == dtype_name(table_dtype) || !dtype ||
        (!same_as_written && !same_resolved_params(*file, params, old_params, *dtype))) {
      continue;
    }
    const nlohmann::json* own = row_checks(kept);
    if (!own || !own->contains(name)) kept["checks"][name] = check;
  }
  return kept;
}

}  // namespace

nlohmann::json write_tuned_table(const fs::path& path, const OpSpec& op, DType dtype,
                                 const std::string& device, const std::string& strategy,
                                 const nlohmann::json& rows, bool merge) {
  nlohmann::json written = nlohmann::json::array();
  nlohmann::json old_rows = nlohmann::json::array();  // the table's rows before, if it is this one
  if (fs::exists(path)) {
    // A table written whole over an old one keeps only the old one's matching checks, and needs
    // nothing else from it: one it cannot read is simply replaced.
    nlohmann::json old;
    try {
      old = read_tuned_table(path);
    } catch (const Error&) {
      if (merge) throw;
    }
    const auto field = [&](const char* key) { return old.value(key, std::string("?")); };
    const bool same_table = old.is_object() && field("op") == op.name() &&
                            field("dtype") == dtype_name(dtype) && field("device") == device;
    if (merge && !same_table) {
      throw UsageError(fmt::format("{} is a table for {} {} on {}, not {} {} on {}", path.string(),
                                   field("op"), field("dtype"), field("device"), op.name(),
                                   dtype_name(dtype), device));
    }
    if (same_table) old_rows = old.at("sizes");
    if (merge) written = old_rows;
  }
  const auto at_shape = [](nlohmann::json& table_rows, const nlohmann::json& row) {
    return std::find_if(table_rows.begin(), table_rows.end(), [&](const nlohmann::json& r) {
      return r.value("shape", std::string()) == row.at("shape").get<std::string>();
    });
  };
  for (nlohmann::json row : rows) {
    if (const auto old = at_shape(old_rows, row); old != old_rows.end())
      row = with_checks_kept(std::string(op.name()), row, *old, dtype);
    const auto same = at_shape(written, row);
    if (same != written.end()) {
      *same = row;
    } else {
      written.push_back(row);
    }
  }
  const nlohmann::json table = {
      {"op", op.name()},      {"dtype", dtype_name(dtype)}, {"device", device},
      {"strategy", strategy}, {"git_sha", git_state().sha}, {"recorded_at", utc_timestamp()},
      {"sizes", written}};
  write_json_atomically(path, table);
  return written;
}

std::string LibraryChoice::describe() const {
  const std::string borrowed =
      borrowed_from ? fmt::format(", {} table, checked in this dtype", dtype_name(*borrowed_from))
                    : std::string();
  const std::string adopted =
      adopted_from.empty()
          ? std::string()
          : fmt::format(", adopted from the {} table, checked and timed here", adopted_from);
  const std::string unchecked =
      checked_in_present_text
          ? std::string()
          : "; not checked in its file's present text (kforge check --table checks it)";
  switch (source) {
    case Source::exact_size:
      return fmt::format("tuned at {}{}{}{}", tuned_shape, borrowed, adopted, unchecked);
    case Source::nearest_size:
      if (predicted_us) {
        return fmt::format(
            "tuned at {} (of the tuned sizes, the one predicted fastest here: {:.1f} us by its "
            "file's busy: line{}{}){}",
            tuned_shape, *predicted_us, borrowed, adopted, unchecked);
      }
      return fmt::format("tuned at {} (the nearest tuned size{}{}){}", tuned_shape, borrowed,
                         adopted, unchecked);
    case Source::defaults:
      break;
  }
  return table.empty() ? "defaults: untuned (no tuned table for this dtype and device)"
                       : "defaults (no tuned size applies)";
}

nlohmann::json LibraryChoice::to_json() const {
  static constexpr const char* kSourceNames[] = {"exact_size", "nearest_size", "defaults"};
  nlohmann::json j = {{"file", file.string()},
                      {"params", params},
                      {"source", kSourceNames[static_cast<int>(source)]},
                      {"describe", describe()}};
  if (!tuned_shape.empty()) j["tuned_shape"] = tuned_shape;
  if (tuned_median_us) j["tuned_median_us"] = *tuned_median_us;
  if (predicted_us) j["predicted_us"] = *predicted_us;
  for (const WeighedRow& w : weighed) {
    j["weighed"].push_back({{"tuned_shape", w.tuned_shape},
                            {"tuned_median_us", w.tuned_median_us},
                            {"predicted_us", w.predicted_us}});
  }
  if (!table.empty()) j["table"] = table.string();
  if (borrowed_from) j["table_dtype"] = dtype_name(*borrowed_from);
  if (!adopted_from.empty()) j["adopted_from"] = adopted_from;
  if (source != Source::defaults) j["checked_in_present_text"] = checked_in_present_text;
  j["untuned_device"] = untuned_device();
  return j;
}

double size_distance(const Sizes& a, const Sizes& b) {
  double d = 0;
  for (const auto& [name, value] : a) {
    const auto it = b.find(name);
    if (it == b.end()) return std::numeric_limits<double>::max();
    if (value > 0 && it->second > 0) {
      d += std::abs(std::log(static_cast<double>(value) / static_cast<double>(it->second)));
    } else if (value != it->second) {
      d += kOtherFlagDistance;
    }
  }
  return d;
}

namespace {

// `params` as a complete, valid tuning of `file`: every name a tunable of the file, every value
// one of its candidates, every requirement and launch limit holding at `sizes` on `device`.
// Empty when not.
std::optional<ParamValues> valid_params(const KernelFile& file, const nlohmann::json& params,
                                        const Sizes& sizes, DType dtype, const DeviceInfo& device) {
  ParamValues values;
  for (const auto& [name, value] : params.items()) {
    const auto p = std::find_if(file.params.begin(), file.params.end(),
                                [&](const TunableParam& t) { return t.name == name; });
    if (p == file.params.end() || !value.is_number_integer()) return std::nullopt;
    const long long v = value.get<long long>();
    if (std::find(p->candidates.begin(), p->candidates.end(), v) == p->candidates.end()) {
      return std::nullopt;
    }
    values[name] = v;
  }
  Bindings bindings = problem_bindings(device, dtype, &sizes);
  const ParamValues all = file.with_derived(file.resolve_params(dtype, values), bindings);
  for (const auto& [name, value] : all)
    bindings[name] = value;
  // A row is reused only where the tuner would have searched it (prune: lines included).
  if (!first_violation(file, bindings, device, true).empty()) return std::nullopt;
  return values;
}

// The other 16-bit float type: f16 <-> bf16 (none for f32).
std::optional<DType> same_width_dtype(DType dtype) {
  if (dtype == DType::f16) return DType::bf16;
  if (dtype == DType::bf16) return DType::f16;
  return std::nullopt;
}

}  // namespace

bool row_serves_dtype(const nlohmann::json& row, DType table_dtype, DType dtype) {
  if (dtype == table_dtype && row.value("final_check", std::string()).starts_with("PASS"))
    return true;
  const nlohmann::json* check = row_check(row, dtype);
  return check && check_passed(*check);
}

bool check_passed(const nlohmann::json& check) {
  return check.value("result", std::string()).starts_with("PASS");
}

std::string row_source_hash(const nlohmann::json& row) {
  const auto key = row.find("variant_key");
  if (key == row.end() || !key->is_string()) return "";
  const std::string text = key->get<std::string>();
  return text.substr(0, text.find('|'));
}

const nlohmann::json* row_check(const nlohmann::json& row, DType dtype) {
  const nlohmann::json* checks = row_checks(row);
  if (!checks || !checks->contains(dtype_name(dtype))) return nullptr;
  return &checks->at(dtype_name(dtype));
}

std::optional<std::string> row_check_text(const nlohmann::json& row, DType dtype) {
  const nlohmann::json* check = row_check(row, dtype);
  if (!check) return std::nullopt;
  return check_source_hash(*check);
}

std::optional<nlohmann::json> row_check_of_code(const nlohmann::json& row, DType table_dtype,
                                                DType dtype, const std::string& text_hash) {
  if (text_hash.empty()) return std::nullopt;
  if (const nlohmann::json* check = row_check(row, dtype);
      check && check_source_hash(*check) == text_hash) {
    return *check;
  }
  if (dtype != table_dtype || row_source_hash(row) != text_hash) return std::nullopt;
  const std::string final_check = row.value("final_check", std::string());
  if (!final_check.starts_with("PASS") && !final_check.starts_with("FAIL")) return std::nullopt;
  nlohmann::json record = {{"result", final_check}, {"source_hash", text_hash}};
  for (const auto& [from, to] :
       {std::pair{"git_sha", "git_sha"}, std::pair{"recorded_at", "checked_at"}}) {
    if (const auto value = row.find(from); value != row.end() && value->is_string())
      record[to] = *value;
  }
  return record;
}

CheckInText row_check_in_text(const nlohmann::json& row, DType table_dtype, DType dtype,
                              const std::string& text_hash) {
  const auto check = row_check_of_code(row, table_dtype, dtype, text_hash);
  if (!check) return CheckInText::none;
  return check_passed(*check) ? CheckInText::passed : CheckInText::failed;
}

int record_table_check(const fs::path& path, const std::string& file, const nlohmann::json& params,
                       DType dtype, const std::string& result, uint64_t seed,
                       const std::string& source_hash) {
  return record_table_check(path, file, params, dtype,
                            {{"result", result},
                             {"seed", seed},
                             {"source_hash", source_hash},
                             {"git_sha", git_state().sha},
                             {"checked_at", utc_timestamp()}});
}

int record_table_check(const fs::path& path, const std::string& file, const nlohmann::json& params,
                       DType dtype, const nlohmann::json& check) {
  nlohmann::json table = read_tuned_table(path);
  int updated = 0;
  for (auto& row : table.at("sizes")) {
    if (!row.contains("file") || row.at("file") != file ||
        row.value("params", nlohmann::json()) != params) {
      continue;
    }
    row["checks"][std::string(dtype_name(dtype))] = check;
    ++updated;
  }
  write_json_atomically(path, table);
  return updated;
}

namespace {

// Whether `file` at its defaults in `dtype` can run on `device` as far as the device decides:
// derived values and requirements that need a problem size are left for the problem.
bool defaults_run_on(const KernelFile& file, DType dtype, const DeviceInfo& device) {
  if (std::find(file.dtypes.begin(), file.dtypes.end(), dtype) == file.dtypes.end()) return false;
  Bindings bindings = problem_bindings(device, dtype, nullptr);
  for (const auto& [name, value] : file.resolve_params(dtype))
    bindings[name] = value;
  for (const DerivedValue& d : file.derived) {
    if (d.expression.bound_by(bindings)) bindings[d.name] = d.expression.evaluate(bindings);
  }
  return first_violation(file, bindings, device, false).empty();
}

}  // namespace

std::string busy_lines_problem(const KernelFile& file, const OpSpec& op) {
  // The device's limits and elem_bytes, as problem_bindings names them.
  std::set<std::string, std::less<>> known;
  for (const auto& [name, value] : problem_bindings(DeviceInfo{}, DType::f32, nullptr))
    known.insert(name);
  std::set<std::string, std::less<>> sizes;
  for (const std::string& name : op.size_names())
    sizes.insert(name);
  known.insert(sizes.begin(), sizes.end());
  for (const TunableParam& p : file.params)
    known.insert(p.name);
  for (const DerivedValue& d : file.derived)
    known.insert(d.name);
  const auto first_unknown = [&](const Expression& e) -> std::string {
    for (const std::string& name : e.variables()) {
      if (!known.contains(name)) return name;
    }
    return "";
  };
  for (const DerivedValue& let : file.busy_lets) {
    if (sizes.contains(let.name)) {
      return fmt::format("line {}: let: '{}' is one of {}'s sizes", let.line, let.name, op.name());
    }
    if (const std::string name = first_unknown(let.expression); !name.empty()) {
      return fmt::format(
          "line {}: let: {} uses '{}', which is no size, limit, tunable, derived "
          "value or earlier let: value",
          let.line, let.name, name);
    }
    known.insert(let.name);
  }
  for (const Expression& busy : file.busy) {
    if (const std::string name = first_unknown(busy); !name.empty()) {
      return fmt::format(
          "busy: '{}' uses '{}', which is no size, limit, tunable, derived value "
          "or let: value",
          busy.text(), name);
    }
  }
  return "";
}

std::optional<double> busy_at(const KernelFile& file, const ParamValues& params, const Sizes& sizes,
                              DType dtype, const DeviceInfo& device) {
  if (file.busy.empty()) return std::nullopt;
  Bindings bindings = problem_bindings(device, dtype, &sizes);
  for (const auto& [name, value] : file.with_derived(file.resolve_params(dtype, params), bindings))
    bindings[name] = value;
  for (const DerivedValue& let : file.busy_lets) {
    if (!let.expression.bound_by(bindings)) return std::nullopt;
    bindings[let.name] = let.expression.evaluate(bindings);
  }
  double busy = 0;
  for (const Expression& kernel_busy : file.busy) {
    if (!kernel_busy.bound_by(bindings)) return std::nullopt;
    busy += static_cast<double>(kernel_busy.evaluate(bindings));
  }
  if (busy <= 0) return std::nullopt;
  return busy;
}

fs::path device_starter(const OpSpec& op, DType dtype, const DeviceInfo& device) {
  const bool cuda = device.backend == "cuda";
  const fs::path starter = library_kernels_dir() / starter_kernel(op.name(), cuda, dtype);
  if (!fs::exists(starter) || defaults_run_on(KernelFile::load(starter), dtype, device))
    return starter;
  for (const KernelFile& file : library_files(std::string(op.name()), device.backend)) {
    if (defaults_run_on(file, dtype, device)) return file.path;
  }
  return starter;
}

LibraryChoice library_choice(const OpSpec& op, const Sizes& sizes, DType dtype,
                             const DeviceInfo& device) {
  const std::string backend = device.backend;
  const std::vector<KernelFile> files = library_files(std::string(op.name()), backend);
  for (const KernelFile& file : files) {
    if (const std::string problem = busy_lines_problem(file, op); !problem.empty())
      throw Error(fmt::format("{}: {}", file.path.string(), problem));
  }
  LibraryChoice choice;
  choice.file = device_starter(op, dtype, device);

  // The dtype's own table, else one of the same element size (see library.h).
  const auto location = find_tuned_table(std::string(op.name()), dtype, device_key(device));
  if (!location) return choice;
  const DType table_dtype = location->dtype;
  const fs::path& table_path = location->path;
  choice.table = table_path;
  if (table_dtype != dtype) choice.borrowed_from = table_dtype;
  const nlohmann::json table = read_tuned_table(table_path);
  // Any JSON error in a row's structure (a row without params, sizes that are not numbers) is
  // the table's: say which file.
  try {
    // `rows` below points into `table_rows`, so it is a named value that outlives the loops.
    const nlohmann::json& table_rows = table.at("sizes");

    // Rows nearest first; the first whose file exists and whose parameters are valid here wins.
    std::vector<std::pair<double, const nlohmann::json*>> rows;
    for (const auto& row : table_rows) {
      if (!row.contains("file") || row.at("file").is_null() || !row.contains("sizes")) continue;
      if (!row_serves_dtype(row, table_dtype, dtype)) continue;
      Sizes row_sizes = row.at("sizes").get<Sizes>();
      rows.emplace_back(size_distance(sizes, row_sizes), &row);
    }
    std::stable_sort(rows.begin(), rows.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    // The rows that can serve here, nearest first.
    struct Candidate {
      double distance;
      const nlohmann::json* row;
      const KernelFile* file;
      CheckInText check;
      ParamValues params;
      std::optional<double> predicted_us;
    };
    std::vector<Candidate> candidates;
    for (const auto& [distance, row] : rows) {
      if (distance == std::numeric_limits<double>::max()) break;
      const std::string name = row->at("file").get<std::string>();
      const auto file = std::find_if(files.begin(), files.end(), [&](const KernelFile& f) {
        return f.path.filename().string() == name;
      });
      if (file == files.end()) continue;
      const CheckInText check = row_check_in_text(*row, table_dtype, dtype, file->text_hash);
      if (check == CheckInText::failed) continue;  // the file as it is now fails there
      const auto params = valid_params(*file, row->at("params"), sizes, dtype, device);
      if (!params) continue;
      candidates.push_back({distance, row, &*file, check, *params, std::nullopt});
      if (distance == 0) break;  // a row of this very size: nothing to predict
    }
    if (candidates.empty()) return choice;
    // A size without a row of its own: where every candidate's file says how its work spreads
    // over the device (busy:), each row's measured time is scaled to this size by it, and the
    // row predicted fastest here is taken; otherwise the nearest. The nearest row's variant can
    // be far from right: a tile that divides its own N can leave a third of another's last tile
    // and wave empty.
    const Candidate* chosen = &candidates.front();
    if (chosen->distance != 0) {
      bool all_predicted = true;
      for (Candidate& c : candidates) {
        const Sizes row_sizes = c.row->at("sizes").get<Sizes>();
        const auto here = busy_at(*c.file, c.params, sizes, dtype, device);
        const auto there = busy_at(*c.file, c.params, row_sizes, dtype, device);
        if (here && there && c.row->contains("time_us")) {
          c.predicted_us = c.row->at("time_us").get<double>() * *here / *there;
        } else {
          all_predicted = false;
        }
      }
      if (all_predicted) {
        chosen = &*std::min_element(candidates.begin(), candidates.end(),
                                    [](const Candidate& a, const Candidate& b) {
                                      return *a.predicted_us < *b.predicted_us;
                                    });
      }
    }
    const nlohmann::json& row = *chosen->row;
    choice.checked_in_present_text = chosen->check == CheckInText::passed;
    choice.file = chosen->file->path;
    choice.params = chosen->params;
    choice.source = chosen->distance == 0 ? LibraryChoice::Source::exact_size
                                          : LibraryChoice::Source::nearest_size;
    choice.tuned_shape = row.value("shape", std::string());
    choice.adopted_from = row.value("adopted_from", std::string());
    if (row.contains("time_us")) choice.tuned_median_us = row.at("time_us").get<double>();
    if (chosen->predicted_us && candidates.size() > 1) {
      choice.predicted_us = chosen->predicted_us;
      for (const Candidate& c : candidates) {
        choice.weighed.push_back({c.row->value("shape", std::string()),
                                  c.row->at("time_us").get<double>(), *c.predicted_us});
      }
    }
    return choice;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not a tuned table: {}", table_path.string(), e.what()));
  }
  return choice;
}

std::optional<TableLocation> find_tuned_table(const std::string& op, DType dtype,
                                              const std::string& device_key) {
  if (fs::path path = tuned_table_path(op, dtype, device_key); fs::exists(path))
    return TableLocation{std::move(path), dtype};
  if (const auto partner = same_width_dtype(dtype)) {
    if (fs::path path = tuned_table_path(op, *partner, device_key); fs::exists(path))
      return TableLocation{std::move(path), *partner};
  }
  return std::nullopt;
}

std::string compute_capability_of(const std::string& device_key) {
  const auto open = device_key.rfind("(cc ");
  if (open == std::string::npos || device_key.back() != ')') return "";
  return device_key.substr(open + 4, device_key.size() - open - 5);
}

std::vector<SameArchitectureTable> same_architecture_tables(const std::string& op, DType dtype,
                                                            const DeviceInfo& device) {
  std::vector<SameArchitectureTable> out;
  const std::string own = device_key(device);
  const std::string cc = compute_capability_of(own);
  if (device.backend != "cuda" || cc.empty()) return out;
  const fs::path dir = library_kernels_dir() / op / "tuned";
  if (!fs::is_directory(dir)) return out;
  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".json") paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  const auto partner = same_width_dtype(dtype);
  for (const auto& path : paths) {
    nlohmann::json table = read_tuned_table(path);
    const std::string device_of = table.value("device", std::string());
    const auto table_dtype = parse_dtype(table.value("dtype", std::string()));
    if (table.value("op", std::string()) != op || !table_dtype ||
        (*table_dtype != dtype && table_dtype != partner) || device_of == own ||
        compute_capability_of(device_of) != cc) {
      continue;
    }
    SameArchitectureTable t{path, {}, device_of, *table_dtype};
    std::vector<std::pair<nlohmann::json, nlohmann::json>> variants;
    for (const auto& row : table.at("sizes")) {
      if (!row.contains("file") || row.at("file").is_null()) continue;
      ++t.rows;
      std::pair v{row.at("file"), row.value("params", nlohmann::json::object())};
      if (std::find(variants.begin(), variants.end(), v) == variants.end()) variants.push_back(v);
      if (row.contains("tune_seconds") && row.contains("evaluations")) {
        t.tune_seconds += row.at("tune_seconds").get<double>();
        t.evaluations += row.at("evaluations").get<size_t>();
      }
    }
    t.variants = variants.size();
    t.table = std::move(table);
    if (t.rows > 0) out.push_back(std::move(t));
  }
  // The problem's own dtype first.
  std::stable_sort(out.begin(), out.end(), [&](const auto& a, const auto& b) {
    return (a.dtype == dtype) > (b.dtype == dtype);
  });
  return out;
}

const nlohmann::json* nearest_table_row(const nlohmann::json& table, const Sizes& sizes) {
  const nlohmann::json* best = nullptr;
  double best_distance = std::numeric_limits<double>::max();
  for (const auto& row : table.at("sizes")) {
    if (!row.contains("file") || row.at("file").is_null() || !row.contains("sizes")) continue;
    const double d = size_distance(sizes, row.at("sizes").get<Sizes>());
    if (d < best_distance) {
      best_distance = d;
      best = &row;
    }
  }
  return best;
}

namespace {

// "about 12 min", "about 40 s".
std::string about_duration(double seconds) {
  if (seconds < 90) return fmt::format("about {:.0f} s", std::max(1.0, seconds));
  if (seconds < 5400) return fmt::format("about {:.0f} min", seconds / 60);
  return fmt::format("about {:.1f} h", seconds / 3600);
}

// Seconds one evaluation takes where no table's tune recorded it: the timing cap of one second
// plus a smoke run and a gate.
constexpr double kAssumedSecondsPerEvaluation = 1.5;
// A winner's final check: five stages, then the winner's sanitizers on a GPU.
constexpr double kAssumedSecondsPerFinalCheck = 20;

}  // namespace

std::string untuned_offer(const OpSpec& op, DType dtype, const DeviceInfo& device,
                          const LibraryChoice& choice) {
  if (!choice.untuned_device()) return "";
  const std::string name(op.name());
  const size_t sizes = op.bench_sizes().size();
  const auto tables = same_architecture_tables(name, dtype, device);
  double per_evaluation = kAssumedSecondsPerEvaluation;
  std::string basis = fmt::format("{:.1f} s each, assumed", per_evaluation);
  for (const auto& t : tables) {
    if (t.evaluations == 0) continue;
    per_evaluation = t.tune_seconds / static_cast<double>(t.evaluations);
    basis = fmt::format("{:.1f} s each, as tuning the {} table took", per_evaluation, t.device);
    break;
  }
  const double evaluations = static_cast<double>(sizes * kOfferedTuneBudget);
  std::string text = fmt::format(
      "no tuned table for {} in {} on {}: this runs the starter's untuned defaults ({}), which "
      "are not the library's tuned kernel for this device.\n"
      "  tune it now:   kforge tune {} --sizes all --dtype {} --budget {}\n"
      "                 ({} sizes x {} evaluations, {} at {}; resumable, progress shown)\n",
      name, dtype_name(dtype), device_key(device), choice.file.filename().string(), name,
      dtype_name(dtype), kOfferedTuneBudget, sizes, kOfferedTuneBudget,
      about_duration(evaluations * per_evaluation), basis);
  for (const auto& t : tables) {
    text += fmt::format(
        "  or adopt:      kforge tune {} --sizes all --dtype {} --adopt \"{}\"\n"
        "                 (the {} table's variant for each of the {} sizes, checked in five stages "
        "and timed here against the defaults: {})\n",
        name, dtype_name(dtype), t.device, t.device, sizes,
        about_duration(static_cast<double>(2 * sizes) * per_evaluation +
                       static_cast<double>(t.variants) * kAssumedSecondsPerFinalCheck));
  }
  if (tables.empty()) {
    text += fmt::format("  (no table of a device with the same architecture to adopt)\n");
  }
  return text;
}

}  // namespace kforge
