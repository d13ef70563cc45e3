// The launch limits a kernel file's declared `threads:`, `shared_bytes:` and `cluster:` values
// are held against before anything is compiled: by the tuner's space solver for every point,
// by the checker for the one variant it builds and by the library for a tuned table's row.
#pragma once

#include <string>

#include "compile/kernel_file.h"
#include "core/dtype.h"
#include "device/backend.h"
#include "ops/op_spec.h"

namespace kforge {

// Why a declared value breaks the device's limits, or "" when it does not.
std::string threads_violation(long long threads, const DeviceInfo& device);
std::string dynamic_shared_violation(long long bytes, const DeviceInfo& device);
std::string cluster_violation(long long blocks, const DeviceInfo& device);

// What a kernel file's expressions may name besides its tunables and derived values: the
// device's limits, `elem_bytes` for `dtype`, and the problem's sizes when `sizes` is given.
Bindings problem_bindings(const DeviceInfo& device, DType dtype, const Sizes* sizes);

// The first `require:` line (with `with_pruning`, `prune:` lines too) that `bindings` bind and
// make false, or nullptr; lines that name something not bound are left for later.
const Requirement* first_broken_requirement(const KernelFile& file, const Bindings& bindings,
                                            bool with_pruning = false);

// The first `require:` that is false, or declared launch value over the device's limits, for
// `bindings` (tunables and derived values included), or "" if all hold. Expressions that name
// something not bound (a problem size, when no problem is given) are left for later. With
// `with_pruning`, `prune:` lines count too (what the tuner would have searched).
std::string first_violation(const KernelFile& file, const Bindings& bindings,
                            const DeviceInfo& device, bool with_pruning = false);

}  // namespace kforge
