#include "export/export_plan.h"

#include <algorithm>
#include <map>
#include <ranges>

#include <fmt/format.h>

#include "compile/compiler.h"
#include "core/error.h"
#include "device/launch_limits.h"
#include "tune/library.h"
#include "tune/results_db.h"

namespace kforge {

namespace {

// `size` as the first input tensor's dimension that has its name, if any does.
std::optional<DispatchDim> input_dimension(const OpSpec& op, const std::string& size) {
  int input = 0;
  for (const TensorSpec& t : op.tensors()) {
    if (t.is_output) break;
    const auto dim = std::find(t.dims.begin(), t.dims.end(), size);
    if (dim != t.dims.end()) {
      return DispatchDim{size, input, static_cast<int>(dim - t.dims.begin()),
                         static_cast<int>(t.dims.size())};
    }
    ++input;
  }
  return std::nullopt;
}

// `size` as the scalar of the same name, if the op passes one.
std::optional<DispatchDim> scalar_of(const OpSpec& op, const std::string& size) {
  const std::vector<ScalarSpec> scalars = op.scalars();
  for (size_t i = 0; i < scalars.size(); ++i) {
    if (scalars[i].name == size) {
      DispatchDim d;
      d.size = size;
      d.scalar = static_cast<int>(i);
      return d;
    }
  }
  return std::nullopt;
}

}  // namespace

std::vector<DispatchDim> dispatch_key(const OpSpec& op) {
  std::vector<DispatchDim> key;
  for (const std::string& size : op.size_names()) {
    const std::optional<DispatchDim> found = input_dimension(op, size);
    if (!found) {
      throw UsageError(
          fmt::format("{} cannot be exported: its size {} is no input's dimension, "
                      "so a call's tensors do not say which variant to run",
                      op.name(), size));
    }
    key.push_back(*found);
  }
  for (const auto& [size, fallback] : op.named_size_defaults()) {
    if (auto found = input_dimension(op, size)) {
      key.push_back(*found);
    } else if (auto scalar = scalar_of(op, size)) {
      key.push_back(*scalar);
    }
  }
  return key;
}

bool dispatchable(const OpSpec& op) {
  try {
    dispatch_key(op);
    return true;
  } catch (const UsageError&) {
    return false;
  }
}

bool in_key(const std::vector<DispatchDim>& key, const std::string& size) {
  return std::any_of(key.begin(), key.end(), [&](const DispatchDim& d) { return d.size == size; });
}

std::optional<int64_t> scalar_as_size(double value) {
  if (!(value >= -kLargestScalarSize && value <= kLargestScalarSize)) return std::nullopt;
  return static_cast<int64_t>(value < 0 ? value - 0.5 : value + 0.5);
}

std::optional<Sizes> dispatch_sizes(const std::vector<DispatchDim>& key,
                                    const std::vector<std::vector<int64_t>>& shapes,
                                    const std::vector<double>& scalars) {
  Sizes sizes;
  for (const DispatchDim& d : key) {
    if (d.scalar >= 0) {
      if (d.scalar >= static_cast<int>(scalars.size())) return std::nullopt;
      const std::optional<int64_t> value = scalar_as_size(scalars[d.scalar]);
      if (!value) return std::nullopt;
      sizes[d.size] = *value;
      continue;
    }
    if (d.input >= static_cast<int>(shapes.size())) return std::nullopt;
    const std::vector<int64_t>& shape = shapes[d.input];
    const int ndim = static_cast<int>(shape.size());
    if (ndim < d.rank) return std::nullopt;
    const int extra = ndim - d.rank;  // leading dimensions folded into dimension 0
    int64_t value = 1;
    if (d.dim == 0) {
      for (int i = 0; i <= extra; ++i)
        value *= shape[i];
    } else {
      value = shape[extra + d.dim];
    }
    sizes[d.size] = value;
  }
  return sizes;
}

namespace {

// The key's sizes out of a problem made by `problem_at` (which may also hold derived sizes).
Sizes key_sizes(const std::vector<DispatchDim>& key, const Sizes& sizes) {
  Sizes out;
  for (const DispatchDim& d : key)
    out[d.size] = sizes.at(d.size);
  return out;
}

// `sizes` as the export keys them, or nothing for a table row to leave out. A named size outside
// the key chooses no variant: a table's row at another value than its default is left out (its
// default row stands for it); a model's or a task's size is taken at the default. Named sizes
// left out get their defaults, then the op completes the rest (kv_heads 0 becomes heads).
std::optional<Sizes> problem_at(const OpSpec& op, const std::vector<DispatchDim>& key, Sizes sizes,
                                bool from_table) {
  for (const auto& [size, fallback] : op.named_size_defaults()) {
    const auto it = sizes.find(size);
    if (it == sizes.end()) {
      sizes[size] = fallback;
    } else if (!in_key(key, size) && it->second != fallback) {
      if (from_table) return std::nullopt;
      it->second = fallback;
    }
  }
  op.complete_sizes(sizes);
  return sizes;
}

}  // namespace

ExportPlan make_export_plan(const ExportRequest& request, const DeviceInfo& device) {
  if (device.backend != "cuda") {
    throw UsageError(
        "an export is for a CUDA device: pass the device's ceilings file "
        "(--ceilings) when this machine has no GPU");
  }
  ExportPlan plan;
  plan.device = device;
  plan.device_key = device_key(device);
  plan.arch = request.arch.empty() ? device.default_arch() : request.arch;
  std::map<std::filesystem::path, KernelFile> files;  // each file parsed once
  for (const OpSpec* op : request.ops) {
    const std::string name(op->name());
    const std::vector<DispatchDim> key = dispatch_key(*op);
    for (const DType dtype : request.dtypes) {
      if (!op->supports(dtype)) {
        throw UsageError(fmt::format("{} does not support {}", name, dtype_name(dtype)));
      }
      ExportOp out;
      out.op = op;
      out.dtype = dtype;
      out.key = key;

      // The sizes: the table's rows, then the extra ones, each once.
      std::vector<std::pair<Sizes, std::string>> sizes;
      const auto add = [&](const Sizes& given, const std::string& source) {
        std::optional<Sizes> s = problem_at(*op, key, given, source == "table");
        if (!s) return;
        const bool seen = std::any_of(sizes.begin(), sizes.end(), [&](const auto& known) {
          return key_sizes(key, known.first) == key_sizes(key, *s);
        });
        if (!seen) sizes.emplace_back(std::move(*s), source);
      };
      if (request.table_sizes) {
        if (const auto location = find_tuned_table(name, dtype, plan.device_key)) {
          const nlohmann::json table = read_tuned_table(location->path);
          for (const auto& row : table.at("sizes")) {
            if (row.contains("sizes")) add(row.at("sizes").get<Sizes>(), "table");
          }
        }
      }
      for (const auto& [extra_op, extra] : request.extra_sizes) {
        if (extra_op == op) add(extra, "plan");
      }
      // The overrides of this op and dtype, each with its key's sizes.
      std::vector<std::pair<Sizes, const ExportOverride*>> overrides;
      for (const ExportOverride& o : request.overrides) {
        if (o.op == op && o.dtype == dtype)
          overrides.emplace_back(key_sizes(key, *problem_at(*op, key, o.sizes, false)), &o);
      }
      const auto override_at = [&](const Sizes& problem) -> const ExportOverride* {
        const Sizes at = key_sizes(key, problem);
        for (const auto& [override_key, o] : overrides) {
          if (override_key == at) return o;
        }
        return nullptr;
      };
      for (const ExportOverride* o : std::views::values(overrides))
        add(o->sizes, "loop");
      if (sizes.empty()) {
        throw UsageError(fmt::format(
            "{} {}: no sizes to export (no table for {} and no plan shapes): tune it first "
            "(kforge tune {} --sizes all) or pass --plan",
            name, dtype_name(dtype), plan.device_key, name));
      }

      for (const auto& [problem, source] : sizes) {
        LibraryChoice choice;
        std::string reason;
        if (const ExportOverride* o = override_at(problem)) {
          choice.file = o->file;  // its own defaults
          reason = o->reason;
        } else {
          choice = library_choice(*op, problem, dtype, device);
          reason = choice.describe();
          out.untuned_device = out.untuned_device || choice.untuned_device();
        }
        auto loaded = files.find(choice.file);
        if (loaded == files.end())
          loaded = files.emplace(choice.file, KernelFile::load(choice.file)).first;
        const KernelFile& file = loaded->second;
        const ParamValues all = file.with_derived(file.resolve_params(dtype, choice.params),
                                                  problem_bindings(device, dtype, &problem));
        const Variant variant = Variant::make(file, all, dtype, plan.arch);
        auto same = std::find_if(out.variants.begin(), out.variants.end(),
                                 [&](const ExportVariant& v) { return v.variant == variant; });
        if (same == out.variants.end()) {
          ExportVariant v;
          v.symbol = fmt::format("kforge_{}_{}_v{}", name, dtype_name(dtype), out.variants.size());
          v.file = choice.file;
          v.variant = variant;
          v.choice = reason;
          v.tuned_us = choice.tuned_median_us;
          v.uses_cutlass = file.uses("cutlass");
          out.variants.push_back(std::move(v));
          same = out.variants.end() - 1;
        }
        out.rows.push_back(
            {key_sizes(key, problem), static_cast<int>(same - out.variants.begin()), source, reason,
             choice.source == LibraryChoice::Source::nearest_size ? op->format_shape(problem)
                                                                  : std::string()});
      }
      plan.ops.push_back(std::move(out));
    }
  }
  return plan;
}

nlohmann::json ExportPlan::to_json() const {
  nlohmann::json ops_json = nlohmann::json::array();
  for (const ExportOp& op : ops) {
    nlohmann::json variants = nlohmann::json::array();
    for (const ExportVariant& v : op.variants) {
      variants.push_back({{"symbol", v.symbol},
                          {"file", v.file.filename().string()},
                          {"params", v.variant.params},
                          {"key", v.variant.key()},
                          {"choice", v.choice},
                          {"tuned_us", v.tuned_us ? nlohmann::json(*v.tuned_us) : nullptr}});
    }
    nlohmann::json rows = nlohmann::json::array();
    for (const ExportRow& r : op.rows) {
      rows.push_back({{"shape", op.op->format_shape(r.sizes)},
                      {"sizes", r.sizes},
                      {"variant", op.variants[r.variant].symbol},
                      {"source", r.source},
                      {"choice", r.choice}});
      if (!r.untuned_shape.empty()) rows.back()["untuned_shape"] = r.untuned_shape;
    }
    nlohmann::json key = nlohmann::json::array();
    for (const DispatchDim& d : op.key) {
      key.push_back(
          d.scalar >= 0
              ? nlohmann::json{{"size", d.size}, {"scalar", d.scalar}}
              : nlohmann::json{
                    {"size", d.size}, {"input", d.input}, {"dim", d.dim}, {"rank", d.rank}});
    }
    ops_json.push_back({{"op", op.op->name()},
                        {"dtype", dtype_name(op.dtype)},
                        {"dispatch_key", key},
                        {"untuned_device", op.untuned_device},
                        {"variants", variants},
                        {"rows", rows}});
  }
  return {{"device", device}, {"device_key", device_key}, {"arch", arch}, {"ops", ops_json}};
}

std::vector<std::pair<const OpSpec*, Sizes>> plan_sizes(const nlohmann::json& plan,
                                                        const std::vector<const OpSpec*>& ops,
                                                        std::vector<DType>* dtypes) {
  std::vector<std::pair<const OpSpec*, Sizes>> out;
  if (!plan.contains("groups")) throw UsageError("not a plan (`kforge plan --json`): no groups");
  for (const auto& g : plan.at("groups")) {
    if (!g.contains("op") || !g.at("sizes").is_object() || !g.at("dtype").is_string()) continue;
    const auto op = std::find_if(ops.begin(), ops.end(), [&](const OpSpec* o) {
      return o->name() == g.at("op").get<std::string>();
    });
    if (op == ops.end()) continue;
    out.emplace_back(*op, g.at("sizes").get<Sizes>());
    const auto dtype = parse_dtype(g.at("dtype").get<std::string>());
    if (dtypes && dtype && std::find(dtypes->begin(), dtypes->end(), *dtype) == dtypes->end())
      dtypes->push_back(*dtype);
  }
  return out;
}

}  // namespace kforge
