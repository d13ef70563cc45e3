// The Amdahl planner: which kernels of a profile are worth a kforge kernel, and how much the
// whole run would gain.
//
// Every kernel is classified (classify.h) and joins exactly one group: kforge op x problem shape
// x dtype, or, for kernels of no kforge op, its own kernel name. Per group, with f its share of
// all kernel time:
//   best time per call  t* = max(bytes / copy ceiling, FLOPs / matmul ceiling,   (measured)
//                                the shortest kernel of the profile)
// where the matmul ceiling is raised to the best throughput a 16-bit GEMM group reached.
//   s_max               = (time per call) / t*          the most a kernel can gain on this GPU
//   gain                = 1 / ((1 - f) + f / s_max)     the whole run's speedup if only this
//                                                       group ran at its roofline
// Groups rank by gain; the cumulative gain assumes every group up to a row fixed.
// docs/planning.md describes the method and the output.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "ops/op_spec.h"
#include "profile/classify.h"
#include "profile/profile.h"

namespace kforge {

struct PlanOptions {
  double copy_gbps = 0;                 // measured device-to-device copy ceiling
  std::optional<double> matmul_tflops;  // measured bf16 matmul ceiling, when there is one
  std::string ceilings_source;          // where they came from (a file, the cache)
  DType default_dtype = DType::bf16;    // when neither input types nor kernel names say
  ClassifyOptions classify;
};

struct KernelNameShare {
  std::string name;
  int64_t kernels = 0;
  int64_t time_ns = 0;
};

// One classification rule's part in a group.
struct RuleUse {
  int64_t kernels = 0;   // kernels it classified
  std::string evidence;  // "context op", "module" or "kernel name"
  std::string reason;
};

struct PlanGroup {
  int rank = 0;
  std::string op;  // a kforge op, or "other"
  // What the table shows: the op; a fusion group around it ("residual_add+rmsnorm",
  // "cast+cross_entropy"); a named group of work no kforge op does ("gelu", "kv_cache"); or
  // "other" (fusion.h).
  std::string name;
  std::optional<Sizes> sizes;  // the problem, when the context determined it
  std::string shape;           // OpSpec::format_shape; "?" when unknown; "-" for other
  std::optional<DType> dtype;  // none for other
  std::string dtype_source;    // "input types", "kernel name", "enclosing range" or "default"
  int64_t kernels = 0;
  // Calls: op calls where the context identified them (one call of an RMSNorm module may launch
  // several kernels), otherwise kernels (calls_are_kernels).
  int64_t calls = 0;
  bool calls_are_kernels = false;
  int64_t time_ns = 0;
  double share = 0;  // of all kernel time
  // The roofline, for groups with a problem.
  std::optional<double> bytes_per_call;
  std::optional<double> flops_per_call;
  std::optional<double> best_ns_per_call;
  std::string bound;  // "memory", "compute" or "latency" (the shortest kernel of the profile)
  std::optional<double> s_max;
  std::optional<double> gain;
  double gain_bound = 1;  // 1 / (1 - f): the gain if this group took no time at all
  std::optional<double> cumulative_gain;
  std::vector<KernelNameShare> kernel_names;  // by time, largest first
  std::map<std::string, RuleUse> rules;       // by rule id
  std::vector<std::string> notes;             // assumptions behind the problem and the bound
  std::vector<std::string> unmapped;          // why the shape is unknown
  int64_t extra_elements = 0;                 // per call, moved by work attached to the op
  std::optional<int64_t> named_elements;      // per call of a named group: its whole traffic

  double ns_per_call() const {
    return calls ? static_cast<double>(time_ns) / static_cast<double>(calls) : 0;
  }
  std::optional<double> achieved_gbps() const;
  std::optional<double> achieved_tflops() const;
  // The compulsory bytes and FLOPs of one call: the op's at its problem plus the attached work's
  // bytes, or a named group's traffic; nullopt without a problem.
  std::optional<Cost> cost() const;
  // A kforge op at a known problem in a dtype the op supports: a task `kforge tune` accepts.
  bool extractable() const;
};

struct Plan {
  std::string device;  // the device with most kernel time
  PlanOptions options;
  int64_t kernels = 0;
  int64_t kernel_time_ns = 0;      // sum of kernel durations: the 100% of shares
  int64_t busy_time_ns = 0;        // union of kernel and transfer intervals
  int64_t transfer_time_ns = 0;    // sum of copy and memset durations (not in any group)
  int64_t shortest_kernel_ns = 0;  // the floor under every group's best time per call
  // Set when a 16-bit matmul or fused_mlp group ran faster than the measured matmul ceiling:
  // its throughput, used as the ceiling instead, and that group ("matmul 2048x16384x1024 bf16").
  std::optional<double> raised_matmul_tflops;
  std::string raised_by;
  std::vector<PlanGroup> groups;  // ranked
  // Gain if every group with a roofline ran at it.
  double all_fixed_gain = 1;
  // Shares of kernel time: in kforge ops (and fusion groups around them), those with a known
  // problem, in named groups, and in neither.
  double op_share = 0;
  double op_share_with_problem = 0;
  double named_share = 0;
  double other_share = 0;
};

// The device whose kernels took the most time (its name as the profile records it).
std::string main_device_name(const Profile& profile);

Plan make_plan(const Profile& profile, const PlanOptions& options);

nlohmann::json plan_to_json(const Plan& plan);

// A task extracted from a plan: what `kforge tune --task FILE` reads back.
struct PlanTask {
  std::string op;
  std::string shape;  // OpSpec::format_shape
  std::string dtype;  // dtype_name
};
nlohmann::json task_to_json(const Plan& plan, const PlanGroup& group,
                            const std::filesystem::path& profile_path);
// Throws UsageError naming the file and the field when it is not a task file.
PlanTask read_task_file(const std::filesystem::path& path);

}  // namespace kforge
