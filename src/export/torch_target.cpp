// The PyTorch export: a package `kforge_ops` whose C++ extension registers one custom op per
// kforge op (torch.ops.kforge.rmsnorm, ...) and runs the compiled modules kforge checked, loaded
// from the package, with an ATen fallback for whatever the export does not cover (counted).
//
//   OUT/setup.py                       pip install --no-build-isolation OUT
//   OUT/csrc/kforge_ops.cpp            the extension (src/export/torch/kforge_ops.cpp)
//   OUT/csrc/kforge/kernel.h           the kernel ABI
//   OUT/kforge_ops/__init__.py         loads the extension (or builds it when imported from a
//                                      directory), the manifest's rows, fake impls, stats()
//   OUT/kforge_ops/patch.py            patch(model): swaps kforge ops into a model
//   OUT/kforge_ops/manifest.json       the plan: device, variants with their module files, rows
//   OUT/kforge_ops/modules/<symbol>.so the compiled variants, as kforge built and checked them
#include <map>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "compile/compiler.h"
#include "core/error.h"
#include "core/json_file.h"
#include "export/export_target.h"

namespace kforge {
namespace fs = std::filesystem;
namespace {

// src/export/torch/ in the source tree: the extension and the package's Python files.
fs::path torch_support_dir() {
  return default_include_dir().parent_path() / "src" / "export" / "torch";
}

std::string setup_py(const ExportPlan& plan, const ExportContext& context) {
  return fmt::format(
      "# kforge_ops: tuned kernels for {} as PyTorch custom ops.\n"
      "# Written by `kforge export --target torch`. Install with\n"
      "#   pip install --no-build-isolation .\n"
      "# (the extension builds against the PyTorch already installed), or put this directory on\n"
      "# sys.path and import kforge_ops (it builds the extension on first import).\n"
      "from setuptools import setup\n"
      "from torch.utils.cpp_extension import BuildExtension, CUDAExtension\n\n"
      "setup(\n"
      "    name=\"kforge_ops\",\n"
      "    version=\"0.1\",\n"
      "    packages=[\"kforge_ops\"],\n"
      "    package_data={{\"kforge_ops\": [\"manifest.json\", \"modules/*.so\"]}},\n"
      "    ext_modules=[\n"
      "        CUDAExtension(\"kforge_ops._C\", [\"csrc/kforge_ops.cpp\"], "
      "include_dirs=[\"csrc\"],\n"
      "                      libraries=[\"dl\"])\n"
      "    ],\n"
      "    cmdclass={{\"build_ext\": BuildExtension}},\n"
      ")\n",
      export_provenance(plan, context));
}

std::string readme(const ExportPlan& plan, const ExportContext& context) {
  std::string rows;
  for (const ExportOp& op : plan.ops) {
    for (const ExportRow& r : op.rows) {
      rows +=
          fmt::format("| kforge::{} | {} | {} | {} | {} |\n", op.op->name(), dtype_name(op.dtype),
                      op.op->format_shape(r.sizes), op.variants[r.variant].symbol, r.choice);
    }
  }
  return fmt::format(
      "# kforge_ops (PyTorch)\n\n"
      "Tuned kernels for {}.\n\n"
      "```sh\npip install --no-build-isolation .      # or: import kforge_ops from this directory\n"
      "```\n\n"
      "```python\nimport kforge_ops\n"
      "report = kforge_ops.patch(model)   # swaps RMSNorm, LayerNorm, RoPE, SwiGLU MLPs; "
      "prints what and where\n"
      "with torch.inference_mode():\n    logits = model(input_ids).logits\n"
      "print(kforge_ops.stats())          # calls per op: 'kforge', or why they fell back\n```\n\n"
      "or, the program unchanged: `kforge patch --export THIS_DIR -- python3 program.py`.\n\n"
      "A call runs the kforge module chosen for its dtype and sizes when its tensors are CUDA,\n"
      "contiguous and on the GPU model below; any other call runs PyTorch's own composite and is\n"
      "counted with its reason. The ops have no backward (an error, never a wrong gradient).\n\n"
      "| op | dtype | sizes | variant | kforge's choice |\n|---|---|---|---|---|\n{}",
      export_provenance(plan, context), rows);
}

class TorchTarget final : public ExportTarget {
 public:
  std::string_view name() const override { return "torch"; }
  std::string_view description() const override {
    return "a PyTorch package: custom ops running the checked modules, with ATen fallbacks, "
           "fake implementations and patch(model)";
  }

  // The ops the extension registers: its KFORGE_OPS list, read from the extension's source so
  // that the list is written once.
  bool serves(const OpSpec& op) const override {
    static const std::set<std::string> served = [] {
      const std::string source = read_text_file(torch_support_dir() / "kforge_ops.cpp");
      const size_t begin = source.find("#define KFORGE_OPS(X)");
      const size_t end = source.find("// clang-format on", begin);
      if (begin == std::string::npos || end == std::string::npos)
        throw Error("the torch extension's source has no KFORGE_OPS list");
      const std::string list = source.substr(begin, end - begin);
      std::set<std::string> names;
      const std::regex item("X\\((\\w+)\\)");
      for (auto it = std::sregex_iterator(list.begin(), list.end(), item);
           it != std::sregex_iterator(); ++it)
        names.insert((*it)[1].str());
      return names;
    }();
    return served.count(std::string(op.name())) > 0;
  }

  std::vector<fs::path> write(const ExportPlan& plan, const ExportContext& context,
                              const fs::path& out) const override {
    for (const ExportOp& op : plan.ops) {
      if (!serves(*op.op))
        throw UsageError(fmt::format("the torch target has no op {} yet", op.op->name()));
      // The extension's dispatch reads tensor dimensions only.
      for (const DispatchDim& d : op.key) {
        if (d.scalar >= 0)
          throw Error(fmt::format("the torch target cannot dispatch {} on its scalar {}",
                                  op.op->name(), d.size));
      }
    }
    std::vector<fs::path> written;
    const fs::path support = torch_support_dir();
    copy_export_file(support / "kforge_ops.cpp", out, "csrc/kforge_ops.cpp", written);
    copy_export_file(context.include_dir / "kforge" / "kernel.h", out, "csrc/kforge/kernel.h",
                     written);
    for (const char* file : {"__init__.py", "patch.py", "verify.py", "_autopatch/sitecustomize.py"})
      copy_export_file(support / "kforge_ops" / file, out, fs::path("kforge_ops") / file, written);

    // The modules: compiled (or taken from kforge's cache) exactly as kforge checks them, all at
    // once, one per core (a CUTLASS variant takes about a minute on one).
    std::map<fs::path, KernelFile> files;  // each file parsed once
    std::vector<std::pair<const KernelFile*, Variant>> work;
    for (const ExportOp& op : plan.ops) {
      for (const ExportVariant& variant : op.variants) {
        auto file = files.find(variant.file);
        if (file == files.end())
          file = files.emplace(variant.file, KernelFile::load(variant.file)).first;
        work.emplace_back(&file->second, variant.variant);
      }
    }
    fmt::print(stderr, "compiling {} modules at once (or taking them from kforge's cache)\n",
               work.size());
    const std::vector<CompileResult> built = Compiler().compile_all(work);
    nlohmann::json manifest = export_manifest(plan, context, name());
    size_t next = 0;
    for (size_t o = 0; o < plan.ops.size(); ++o) {
      const ExportOp& op = plan.ops[o];
      for (size_t v = 0; v < op.variants.size(); ++v, ++next) {
        const ExportVariant& variant = op.variants[v];
        if (!built[next].ok) {
          throw Error(
              fmt::format("{} does not compile: {}", variant.variant.describe(), built[next].log));
        }
        const std::string module = variant.symbol + ".so";
        copy_export_file(built[next].module, out, fs::path("kforge_ops") / "modules" / module,
                         written);
        manifest["ops"][o]["variants"][v]["module"] = module;
      }
    }
    write_export_file(out, "kforge_ops/manifest.json", manifest.dump(2) + "\n", written);
    write_export_file(out, "setup.py", setup_py(plan, context), written);
    write_export_file(out, "README.md", readme(plan, context), written);
    return written;
  }
};

}  // namespace

const ExportTarget& torch_export_target() {
  static const TorchTarget target;
  return target;
}

}  // namespace kforge
