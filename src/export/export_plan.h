// What an export carries out of kforge: for each op and dtype, the library variants chosen for a
// set of sizes, and the size -> variant dispatch a caller runs them by.
//
// The sizes are the op's tuned table's (every size the table has a row for) plus the shapes a
// plan found in the user's model. Each size gets exactly the variant `library_choice` gives it
// (the table's row, or the nearest row whose requirements hold there, or the defaults), so an
// exported op runs what `kforge bench OP` timed. A size not in the dispatch is not covered: the
// exported call says so (KF_ERR_UNSUPPORTED) and the caller falls back to its own op.
//
// The dispatch key is the op's sizes as a call shows them (see DispatchDim): its size names read
// from the input tensors' shapes, and its named sizes (attention's causal, kv_heads) from a
// tensor dimension or a scalar of the same name. A named size a call does not show (attention's
// scale_permille, which reaches the kernel as sm_scale) is not in the key: the table's rows are
// exported at its default only, and a call runs the variant of its other sizes whatever value
// it passes (the kernels take any).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compile/kernel_file.h"
#include "compile/variant.h"
#include "device/backend.h"
#include "ops/op_spec.h"

namespace kforge {

// Where one size is read from: input `input`'s dimension `dim` of the `rank` its spec declares.
// A tensor with more dimensions than `rank` has its leading ones folded into dimension 0 (the
// rows of [batch, seq, hidden] are batch * seq), as the kernels themselves do. Or, where
// `scalar` >= 0, the call's scalar of that index, rounded to an integer (a flag).
struct DispatchDim {
  std::string size;  // the size name, e.g. "M"
  int input = 0;
  int dim = 0;
  int rank = 0;
  int scalar = -1;
};

// One compiled variant of an exported op: a kernel file with every parameter fixed.
struct ExportVariant {
  std::string symbol;  // its entry point's name in an export, e.g. "kforge_rmsnorm_bf16_v0"
  std::filesystem::path file;
  Variant variant;                 // tunables and derived values, dtype, arch: what kforge compiles
  std::string choice;              // LibraryChoice::describe() at the first size that chose it
  std::optional<double> tuned_us;  // its tuned time at that size, when it came from a table
  bool uses_cutlass = false;       // its file `uses: cutlass` (built with CUTLASS's headers)
};

// A size the dispatch covers and the variant it runs.
struct ExportRow {
  Sizes sizes;         // the op's size names only (the dispatch key)
  int variant = 0;     // index into ExportOp::variants
  std::string source;  // "table" or "plan"
  std::string choice;  // LibraryChoice::describe() at these sizes
  // Where the library runs another size's table row here (the nearest, or the one its busy:
  // lines predict fastest), the whole problem's shape: a tune of it would give it a row of its
  // own. Empty otherwise.
  std::string untuned_shape;
};

struct ExportOp {
  const OpSpec* op = nullptr;
  DType dtype = DType::bf16;
  std::vector<DispatchDim> key;  // size_names(), then the named sizes a call shows
  std::vector<ExportVariant> variants;
  std::vector<ExportRow> rows;
  bool untuned_device = false;  // no table for this device: every row runs the defaults
};

struct ExportPlan {
  DeviceInfo device;
  std::string device_key;  // the tables' device key, e.g. "NVIDIA H100 80GB HBM3 (cc 9.0)"
  std::string arch;        // "sm_90a"
  std::vector<ExportOp> ops;

  nlohmann::json to_json() const;
};

// A kernel file to export for one size in place of the library's choice: a loop task's best
// (`kforge export --workspace`), compiled with its own defaults.
struct ExportOverride {
  const OpSpec* op = nullptr;
  DType dtype = DType::bf16;
  Sizes sizes;  // completed
  std::filesystem::path file;
  std::string reason;  // for the export's table, e.g. "loop task-01-rmsnorm: 1.42x"
};

struct ExportRequest {
  std::vector<const OpSpec*> ops;
  std::vector<DType> dtypes;
  // Sizes beyond the tables' (a plan's shapes), by op name; each is completed by the op spec.
  std::vector<std::pair<const OpSpec*, Sizes>> extra_sizes;
  bool table_sizes = true;                // every size of the device's table, too
  std::vector<ExportOverride> overrides;  // sizes run by a given file (each exported too)
  std::string arch;                       // empty: the device's default
};

// Where each of `op`'s size names, then each named size a call shows, is read from; throws
// UsageError when a size name is not the dimension of any input (such an op cannot be
// dispatched on its tensors).
std::vector<DispatchDim> dispatch_key(const OpSpec& op);

// Whether dispatch_key(op) exists: every size name of `op` is an input dimension.
bool dispatchable(const OpSpec& op);

// Whether `size` is one of `key`'s sizes.
bool in_key(const std::vector<DispatchDim>& key, const std::string& size);

// A call's scalar as a size of the dispatch key: rounded half away from zero, exactly as the
// generated dispatch does; nothing for a value that is not finite or beyond kLargestScalarSize.
inline constexpr double kLargestScalarSize = 9007199254740992.0;  // 2^53: doubles are exact
std::optional<int64_t> scalar_as_size(double value);

// The dispatch key's values for tensors of `shapes` (one per input) and `scalars`, or nothing
// when a tensor has fewer dimensions than its spec or a scalar is missing. The same rule the
// generated dispatch code follows.
std::optional<Sizes> dispatch_sizes(const std::vector<DispatchDim>& key,
                                    const std::vector<std::vector<int64_t>>& shapes,
                                    const std::vector<double>& scalars = {});

// The variants and dispatch of `request` on `device`. Ops or dtypes the device's library cannot
// serve (no CUDA kernel file, a dtype the op does not declare) are UsageErrors.
ExportPlan make_export_plan(const ExportRequest& request, const DeviceInfo& device);

// The shapes of a plan (`kforge plan --json`) whose groups name an op among `ops` with sizes
// and a dtype: what a model runs, to export beside the tables' sizes.
std::vector<std::pair<const OpSpec*, Sizes>> plan_sizes(const nlohmann::json& plan,
                                                        const std::vector<const OpSpec*>& ops,
                                                        std::vector<DType>* dtypes);

}  // namespace kforge
