// Export targets: the forms tuned kernels leave kforge in (standalone CUDA sources, a PyTorch
// extension). Each target writes one ExportPlan into a directory. Targets register by name in
// export_target.cpp's list; a new one is a file in this folder and one line there.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "export/export_plan.h"

namespace kforge {

// What every target records about the export beside the plan.
struct ExportContext {
  nlohmann::json run;                 // run_metadata(): git SHA, date, command line
  std::filesystem::path include_dir;  // include/ (kforge/kernel.h and the kernels' headers)
  // CUTLASS's include/ as kforge compiles with it (default_cutlass_include_dir()); empty when
  // not installed. A target whose user builds CUTLASS variants names it as the default.
  std::filesystem::path cutlass_include_dir;
};

class ExportTarget {
 public:
  virtual ~ExportTarget() = default;
  virtual std::string_view name() const = 0;
  virtual std::string_view description() const = 0;
  // Whether the target can carry `op` (a target may serve only some ops).
  virtual bool serves(const OpSpec& op) const {
    (void)op;
    return true;
  }
  // Writes the export of `plan` into `out`, a directory that does not exist or is empty, and
  // returns the files written, relative to `out`.
  virtual std::vector<std::filesystem::path> write(const ExportPlan& plan,
                                                   const ExportContext& context,
                                                   const std::filesystem::path& out) const = 0;
};

const std::vector<const ExportTarget*>& export_targets();
// Null when no target has that name.
const ExportTarget* find_export_target(std::string_view name);

// ---- Shared by the targets ----

// Writes `text` to `out / relative`, creating directories, and adds `relative` to `written`.
void write_export_file(const std::filesystem::path& out, const std::filesystem::path& relative,
                       const std::string& text, std::vector<std::filesystem::path>& written);

// Copies `source` to `out / relative`, creating directories, and adds `relative` to `written`.
void copy_export_file(const std::filesystem::path& source, const std::filesystem::path& out,
                      const std::filesystem::path& relative,
                      std::vector<std::filesystem::path>& written);

// Copies what the plan's variants compile from: include/kforge/ (the ABI and the headers kernel
// files include) to include/kforge/, and each used kernel file with its folder's headers to
// kernels/<op>/.
void copy_export_sources(const ExportPlan& plan, const ExportContext& context,
                         const std::filesystem::path& out,
                         std::vector<std::filesystem::path>& written);

// A C translation unit for one variant: its dtype macro and parameters defined, its entry
// point renamed to the variant's symbol, then the kernel file included (from `kernels_dir`,
// relative to the unit).
std::string variant_source(const ExportOp& op, const ExportVariant& variant,
                           const std::string& kernels_dir);

// The C header declaring, per op, `int kforge_<op>(const kf_args*)` and
// `const char* kforge_<op>_variant(const kf_args*)`.
std::string export_header(const ExportPlan& plan, const ExportContext& context);

// The C dispatch: per op, the covered sizes of each dtype and the variant each runs.
std::string dispatch_source(const ExportPlan& plan, const ExportContext& context);

// The plan as JSON with the target's name and the run's provenance: every export's manifest.
nlohmann::json export_manifest(const ExportPlan& plan, const ExportContext& context,
                               std::string_view target);

// The kf_dtype enumerator's name in C, e.g. "KF_DTYPE_BF16".
std::string abi_dtype_name(DType dtype);

// "NVIDIA H100 80GB HBM3 (cc 9.0), sm_90a; kforge 611e76a, 2026-11-24T08:40:00Z"
std::string export_provenance(const ExportPlan& plan, const ExportContext& context);

}  // namespace kforge
