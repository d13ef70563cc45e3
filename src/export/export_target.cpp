#include "export/export_target.h"

#include <algorithm>
#include <cctype>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "compile/compiler.h"
#include "core/error.h"
#include "core/json_file.h"

namespace kforge {
namespace fs = std::filesystem;

const ExportTarget& standalone_export_target();
const ExportTarget& torch_export_target();

const std::vector<const ExportTarget*>& export_targets() {
  static const std::vector<const ExportTarget*> targets = {&standalone_export_target(),
                                                           &torch_export_target()};
  return targets;
}

const ExportTarget* find_export_target(std::string_view name) {
  for (const ExportTarget* t : export_targets()) {
    if (t->name() == name) return t;
  }
  return nullptr;
}

void write_export_file(const fs::path& out, const fs::path& relative, const std::string& text,
                       std::vector<fs::path>& written) {
  const fs::path path = out / relative;
  fs::create_directories(path.parent_path());
  write_text_atomically(path, text);
  written.push_back(relative);
}

void copy_export_file(const fs::path& source, const fs::path& out, const fs::path& relative,
                      std::vector<fs::path>& written) {
  fs::create_directories((out / relative).parent_path());
  fs::copy_file(source, out / relative, fs::copy_options::overwrite_existing);
  written.push_back(relative);
}

void copy_export_sources(const ExportPlan& plan, const ExportContext& context, const fs::path& out,
                         std::vector<fs::path>& written) {
  for (const auto& entry : fs::directory_iterator(context.include_dir / "kforge")) {
    if (entry.is_regular_file())
      copy_export_file(entry.path(), out, fs::path("include") / "kforge" / entry.path().filename(),
                       written);
  }
  std::set<fs::path> copied;   // relative paths written
  std::set<fs::path> folders;  // kernel folders whose headers are copied
  for (const ExportOp& op : plan.ops) {
    const fs::path target = fs::path("kernels") / std::string(op.op->name());
    for (const ExportVariant& v : op.variants) {
      // The kernel file and its folder's headers (a file may include a sibling .cuh).
      std::vector<fs::path> sources = {v.file};
      if (folders.insert(v.file.parent_path()).second) {
        for (const auto& entry : fs::directory_iterator(v.file.parent_path())) {
          const std::string ext = entry.path().extension().string();
          if (ext == ".cuh" || ext == ".h") sources.push_back(entry.path());
        }
      }
      for (const fs::path& source : sources) {
        if (copied.insert(target / source.filename()).second)
          copy_export_file(source, out, target / source.filename(), written);
      }
    }
  }
}

nlohmann::json export_manifest(const ExportPlan& plan, const ExportContext& context,
                               std::string_view target) {
  nlohmann::json manifest = plan.to_json();
  manifest["target"] = target;
  manifest["run"] = context.run;
  return manifest;
}

std::string abi_dtype_name(DType dtype) {
  std::string name(dtype_name(dtype));  // "bf16" -> "KF_DTYPE_BF16", as kforge/kernel.h spells it
  for (char& c : name)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return "KF_DTYPE_" + name;
}

std::string export_provenance(const ExportPlan& plan, const ExportContext& context) {
  return fmt::format("{}, {}; kforge {}, {}", plan.device_key, plan.arch,
                     context.run.value("kforge_git_sha", "unknown"),
                     context.run.value("date", "unknown"));
}

std::string variant_source(const ExportOp& op, const ExportVariant& variant,
                           const std::string& kernels_dir) {
  std::string text = fmt::format(
      "// kforge export: {} {}, variant {} ({}).\n"
      "// {} with these parameters, its entry point renamed; kforge variant key {}.\n"
      "#define {} 1\n",
      op.op->name(), dtype_name(op.dtype), variant.symbol, variant.choice,
      variant.file.filename().string(), variant.variant.key(), elem_macro_name(op.dtype));
  for (const auto& [name, value] : variant.variant.params)
    text += fmt::format("#define {} {}\n", name, value);
  text += fmt::format("#define kforge_run {}\n#include \"{}/{}/{}\"\n", variant.symbol, kernels_dir,
                      op.op->name(), variant.file.filename().string());
  return text;
}

namespace {

// "8192x8192, 4096x4096" for an op's rows of one dtype.
std::string covered_shapes(const ExportOp& op) {
  std::vector<std::string> shapes;
  for (const ExportRow& r : op.rows)
    shapes.push_back(op.op->format_shape(r.sizes));
  return fmt::format("{}", fmt::join(shapes, ", "));
}

// The exported ops, each once, in the plan's order (a plan holds one ExportOp per dtype).
std::vector<const OpSpec*> distinct_ops(const ExportPlan& plan) {
  std::vector<const OpSpec*> ops;
  for (const ExportOp& op : plan.ops) {
    if (std::find(ops.begin(), ops.end(), op.op) == ops.end()) ops.push_back(op.op);
  }
  return ops;
}

}  // namespace

std::string export_header(const ExportPlan& plan, const ExportContext& context) {
  std::string text = fmt::format(
      "/* kforge export: tuned kernels for {}.\n"
      " * Written by `kforge export`; export again rather than edit.\n"
      " *\n"
      " * kforge_<op>(args) runs the op on args->stream (the kforge ABI, kforge/kernel.h) with\n"
      " * the variant tuned for the call's dtype and sizes. A call whose dtype or sizes the\n"
      " * export does not cover returns KF_ERR_UNSUPPORTED and launches nothing: run your own\n"
      " * op then. kforge_<op>_variant(args) names the variant a call would run, or NULL.\n"
      " * Sizes are read from the inputs' shapes; leading dimensions beyond an input's declared\n"
      " * rank fold into its first (x[batch, seq, hidden] is x[batch * seq, hidden]). A flag\n"
      " * (attention's causal) is read from the scalar of its name.\n"
      " */\n"
      "#ifndef KFORGE_EXPORT_H_\n#define KFORGE_EXPORT_H_\n\n#include \"kforge/kernel.h\"\n\n"
      "#ifdef __cplusplus\nextern \"C\" {{\n#endif\n",
      export_provenance(plan, context));
  for (const OpSpec* spec : distinct_ops(plan)) {
    std::vector<std::string> names;
    for (const ScalarSpec& s : spec->scalars())
      names.push_back(s.name);
    const std::string scalars = fmt::format("{}", fmt::join(names, ", "));
    text += fmt::format("\n/* {}: {}\n *   {}\n", spec->name(), spec->signature(), spec->formula());
    if (!scalars.empty()) text += fmt::format(" *   scalars: {}\n", scalars);
    const ExportOp* first = nullptr;
    for (const ExportOp& op : plan.ops) {
      if (op.op != spec) continue;
      if (!first) first = &op;
      text += fmt::format(" *   {} sizes: {}\n", dtype_name(op.dtype), covered_shapes(op));
    }
    for (const auto& [size, fallback] : spec->named_size_defaults()) {
      if (!in_key(first->key, size)) {
        text += fmt::format(
            " *   {} is listed at its default but does not choose the variant: a call may pass "
            "any\n *   value in its scalars, and runs the variant of its other sizes\n",
            size);
      }
    }
    text += fmt::format(
        " */\nint kforge_{0}(const kf_args* args);\nconst char* kforge_{0}_variant(const kf_args* "
        "args);\n",
        spec->name());
  }
  text += "\n#ifdef __cplusplus\n}\n#endif\n\n#endif /* KFORGE_EXPORT_H_ */\n";
  return text;
}

std::string dispatch_source(const ExportPlan& plan, const ExportContext& context) {
  std::string text = fmt::format(
      "/* kforge export: size -> variant dispatch for {0}.\n"
      " * Written by `kforge export`; export again rather than edit. */\n"
      "#include <stddef.h>\n\n#include \"kforge_export.h\"\n\n"
      "typedef int (*kf_export_entry)(const kf_args*);\n\n"
      "typedef struct kf_export_row {{\n"
      "  int64_t sizes[KF_MAX_DIMS]; /* the op's sizes, in its dispatch key's order */\n"
      "  kf_export_entry run;\n"
      "  const char* name;\n"
      "}} kf_export_row;\n\n"
      "/* Dimension `dim` of input `input`, declared with `rank` dimensions: leading dimensions\n"
      " * beyond `rank` fold into dimension 0. -1 when the tensor has fewer dimensions. */\n"
      "static int64_t kf_export_dim(const kf_args* args, int input, int dim, int rank) {{\n"
      "  const kf_tensor* t = &args->inputs[input];\n"
      "  const int extra = t->ndim - rank;\n"
      "  if (extra < 0) return -1;\n"
      "  if (dim > 0) return t->shape[extra + dim];\n"
      "  int64_t folded = 1;\n"
      "  for (int i = 0; i <= extra; ++i) folded *= t->shape[i];\n"
      "  return folded;\n"
      "}}\n\n"
      "/* Scalar `index` of the call rounded half away from zero (a flag such as causal); -1\n"
      " * when the call passes fewer scalars or the value is not finite or beyond 2^53. */\n"
      "static int64_t kf_export_scalar(const kf_args* args, int index) {{\n"
      "  if (args->scalars == NULL || args->num_scalars <= index) return -1;\n"
      "  const double v = args->scalars[index];\n"
      "  if (!(v >= -{1:.1f} && v <= {1:.1f})) return -1;\n"
      "  return (int64_t)(v < 0 ? v - 0.5 : v + 0.5);\n"
      "}}\n\n"
      "static const kf_export_row* kf_export_find(const kf_export_row* rows, size_t count,\n"
      "                                           const int64_t* key, int key_len) {{\n"
      "  for (size_t r = 0; r < count; ++r) {{\n"
      "    int same = 1;\n"
      "    for (int i = 0; i < key_len && same; ++i) same = rows[r].sizes[i] == key[i];\n"
      "    if (same) return &rows[r];\n"
      "  }}\n"
      "  return NULL;\n"
      "}}\n",
      export_provenance(plan, context), kLargestScalarSize);
  for (const OpSpec* spec : distinct_ops(plan)) {
    const std::string name(spec->name());
    const ExportOp* first = nullptr;
    text += fmt::format("\n/* ---- {} ---- */\n", name);
    for (const ExportOp& op : plan.ops) {
      if (op.op != spec) continue;
      if (!first) first = &op;
      if (op.key.size() > KF_MAX_DIMS) {
        throw Error(fmt::format("{} has more sizes than a dispatch row holds", name));
      }
      for (const ExportVariant& v : op.variants)
        text += fmt::format("int {}(const kf_args* args);\n", v.symbol);
      text += fmt::format("static const kf_export_row kforge_{}_{}_rows[] = {{\n", name,
                          dtype_name(op.dtype));
      for (const ExportRow& r : op.rows) {
        std::vector<int64_t> values;
        for (const DispatchDim& d : op.key)
          values.push_back(r.sizes.at(d.size));
        const std::string sizes = fmt::format("{}", fmt::join(values, ", "));
        const ExportVariant& v = op.variants[r.variant];
        text += fmt::format("    {{{{{}}}, {}, \"{}\"}}, /* {} ({}) */\n", sizes, v.symbol,
                            v.symbol, spec->format_shape(r.sizes), r.source);
      }
      text += "};\n";
    }
    int inputs = 0;
    std::string key_reads;
    for (size_t i = 0; i < first->key.size(); ++i) {
      const DispatchDim& d = first->key[i];
      if (d.scalar >= 0) {
        key_reads +=
            fmt::format("  key[{}] = kf_export_scalar(args, {}); /* {} */\n", i, d.scalar, d.size);
        continue;
      }
      inputs = std::max(inputs, d.input + 1);
      key_reads += fmt::format("  key[{}] = kf_export_dim(args, {}, {}, {}); /* {} */\n", i,
                               d.input, d.dim, d.rank, d.size);
    }
    std::string cases;
    for (const ExportOp& op : plan.ops) {
      if (op.op != spec) continue;
      cases += fmt::format(
          "    case {0}:\n      return kf_export_find(kforge_{1}_{2}_rows,\n"
          "                            sizeof kforge_{1}_{2}_rows / sizeof kforge_{1}_{2}_rows[0], "
          "key, {3});\n",
          abi_dtype_name(op.dtype), name, dtype_name(op.dtype), first->key.size());
    }
    text += fmt::format(
        "static const kf_export_row* kforge_{0}_row(const kf_args* args) {{\n"
        "  int64_t key[{1}];\n"
        "  if (args == NULL || args->abi_version != KFORGE_ABI_VERSION || args->num_inputs < {2})\n"
        "    return NULL;\n"
        "{3}"
        "  switch (args->inputs[0].dtype) {{\n{4}"
        "    default:\n      return NULL;\n  }}\n}}\n\n"
        "int kforge_{0}(const kf_args* args) {{\n"
        "  const kf_export_row* row = kforge_{0}_row(args);\n"
        "  return row != NULL ? row->run(args) : KF_ERR_UNSUPPORTED;\n}}\n\n"
        "const char* kforge_{0}_variant(const kf_args* args) {{\n"
        "  const kf_export_row* row = kforge_{0}_row(args);\n"
        "  return row != NULL ? row->name : NULL;\n}}\n",
        name, first->key.size(), inputs, key_reads, cases);
  }
  return text;
}

}  // namespace kforge
