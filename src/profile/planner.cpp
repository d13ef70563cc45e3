#include "profile/planner.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <fstream>
#include <numeric>
#include <set>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "core/error.h"
#include "profile/fusion.h"
#include "profile/op_shapes.h"

namespace kforge {
namespace fs = std::filesystem;
namespace {

// One call of an op: the kernels it launched.
struct Call {
  std::vector<size_t> kernels;  // indices into profile.kernels
  bool from_context = false;    // a context op identified it (else: one kernel, by its name)
};

std::string context_key(const OpContext& c) {
  std::string key = c.name;
  if (c.call != 0) key += fmt::format("\x1f#{}", c.call);
  if (c.input_dims.empty() && c.input_types.empty() && c.input_values.empty()) return key;
  return key + '\x1f' + nlohmann::json(c.input_dims).dump() + '\x1f' +
         nlohmann::json(c.input_types).dump() + '\x1f' + nlohmann::json(c.input_values).dump();
}

// Kernels per process and stream, in start order.
std::vector<size_t> launch_order(const Profile& profile) {
  std::vector<size_t> order(profile.kernels.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const KernelRecord &x = profile.kernels[a], &y = profile.kernels[b];
    return std::tie(x.pid, x.stream, x.start_ns, x.end_ns) <
           std::tie(y.pid, y.stream, y.start_ns, y.end_ns);
  });
  return order;
}

// The shortest period p (dividing n) with names[i] == names[i % p]: consecutive calls of one op
// launch the same kernels in the same order.
size_t period(const std::vector<std::string_view>& names) {
  const size_t n = names.size();
  for (size_t p = 1; p < n; ++p) {
    if (n % p != 0) continue;
    bool repeats = true;
    for (size_t i = p; i < n && repeats; ++i)
      repeats = names[i] == names[i % p];
    if (repeats) return p;
  }
  return n;
}

// Splits the kernels into calls. Kernels whose deciding entry identifies its call (a call number,
// PyTorch's seq/op_id) are one call per entry, wherever they ran. Other kernels a context op
// classified form runs: consecutive kernels (per process and stream, in start order) with the
// same deciding context, cut into repeats of their kernel-name sequence.
std::vector<Call> split_into_calls(const Profile& profile, const std::vector<size_t>& order,
                                   const std::vector<KernelFacts>& facts) {
  std::vector<Call> calls;
  std::unordered_map<const ContextOp*, size_t> call_of_entry;
  std::vector<size_t> run;
  std::string run_key;
  const auto flush = [&] {
    if (run.empty()) return;
    std::vector<std::string_view> names;
    for (const size_t k : run)
      names.push_back(facts[k].name);
    const size_t p = period(names);
    for (size_t begin = 0; begin < run.size(); begin += p)
      calls.push_back({std::vector<size_t>(run.begin() + static_cast<std::ptrdiff_t>(begin),
                                           run.begin() + static_cast<std::ptrdiff_t>(begin + p)),
                       true});
    run.clear();
    run_key.clear();
  };
  for (const size_t k : order) {
    const KernelFacts& f = facts[k];
    if (f.what.context_index < 0) {
      flush();
      calls.push_back({{k}, false});
      continue;
    }
    const ContextOp* deciding = f.context[static_cast<size_t>(f.what.context_index)];
    if (deciding->identifies_call) {
      flush();
      const auto [at, added] = call_of_entry.try_emplace(deciding, calls.size());
      if (added) calls.push_back({{}, true});
      calls[at->second].kernels.push_back(k);
      continue;
    }
    const KernelRecord& kernel = profile.kernels[k];
    std::string key =
        fmt::format("{}\x1e{}\x1e{}\x1e{}", kernel.pid, kernel.stream, f.what.op, f.what.rule);
    // One parsed entry per distinct text, dims, types and values (context_key): trace entries
    // "aten::mm" of different shapes differ here although their texts do not.
    for (int i = 0; i <= f.what.context_index; ++i)
      key += fmt::format("\x1e{}", static_cast<const void*>(f.context[static_cast<size_t>(i)]));
    if (key != run_key) flush();
    run_key = std::move(key);
    run.push_back(k);
  }
  flush();
  return calls;
}

void count_rule(PlanGroup& g, const Classification& c) {
  RuleUse& use = g.rules[c.rule];
  use.kernels += 1;
  if (use.reason.empty()) {
    use.evidence = std::string(evidence_name(c.evidence));
    use.reason = c.reason;
  }
}

void add_unique(std::vector<std::string>& list, const std::string& item) {
  if (std::find(list.begin(), list.end(), item) == list.end()) list.push_back(item);
}

// One call of a kforge op with its problem and dtype, before it joins a group.
struct PendingCall {
  const Call* call = nullptr;
  std::optional<MappedProblem> problem;
  std::string why_not;  // when there is no problem
  DType dtype = DType::bf16;
  std::string dtype_source;  // "input types", "kernel name", "enclosing range" or "default"
  std::string dtype_note;
  const Fusion* fusion = nullptr;       // work attached to the call (fusion.h)
  std::optional<NamedGroupCall> named;  // a named group's call, when its inputs say
};

bool dtype_is_own(const PendingCall& pc) {
  return pc.dtype_source == "input types" || pc.dtype_source == "kernel name";
}

// The problem from the deciding context entry, with what the kernels' names and the ranges
// around it add; the dtype from the op's input types, else the kernels' names, else the default
// (resolve_dtypes_from_ranges may replace that).
PendingCall resolve_call(const Call& call, const std::vector<KernelFacts>& facts,
                         const Fusions& fusions, DType default_dtype) {
  PendingCall pc;
  pc.call = &call;
  pc.why_not = "the kernel name alone gives no shape";
  const KernelFacts& first = facts[call.kernels.front()];
  const ContextOp* deciding =
      call.from_context ? first.context[static_cast<size_t>(first.what.context_index)] : nullptr;
  if (deciding) {
    if (const auto found = fusions.find(deciding); found != fusions.end())
      pc.fusion = &found->second;
  }
  ShapeHints hints;
  std::optional<DType> name_dtype;
  for (const size_t k : call.kernels) {
    if (!hints.causal) hints.causal = causal_from_kernel_name(facts[k].name);
    // A 16-bit type named by any kernel of the call wins: library kernels name float as their
    // accumulator too.
    const auto named = dtype_from_kernel_name(facts[k].name);
    if (named && (!name_dtype || *name_dtype == DType::f32)) name_dtype = named;
  }
  if (call.from_context) {
    // A flag the kernels do not name may be an argument of the deciding op or of an op or
    // module range around it (SDPA's is_causal, innermost first).
    for (int i = first.what.context_index; i >= 0 && !hints.causal; --i) {
      const ContextOp& c = *first.context[static_cast<size_t>(i)];
      for (const char* key : {"is_causal", "causal"}) {
        if (const auto it = c.fields.find(key); !hints.causal && it != c.fields.end())
          hints.causal = parse_flag(it->second);
      }
    }
    if (first.what.op != "other") {
      pc.problem = map_problem(first.what.op, *deciding, hints, &pc.why_not);
    } else {
      pc.named = named_group_call(first.what.group, *deciding);
      if (!pc.named) pc.why_not = "its inputs do not give the tensor it makes";
    }
  }
  std::optional<DType> named_dtype;
  if (pc.named && pc.named->dtype_input < deciding->input_types.size())
    named_dtype = dtype_from_torch_type(deciding->input_types[pc.named->dtype_input]);
  if (pc.fusion && pc.fusion->dtype_from_range) {
    // An attached cast: the op reads what the model made, in the dtype the code around it
    // computes in (resolve_dtypes_from_ranges), not the cast's.
    pc.dtype = default_dtype;
    pc.dtype_source = "default";
  } else if (named_dtype) {
    pc.dtype = *named_dtype;
    pc.dtype_source = "input types";
  } else if (pc.problem && pc.problem->dtype) {
    pc.dtype = *pc.problem->dtype;
    pc.dtype_source = "input types";
  } else if (name_dtype) {
    pc.dtype = *name_dtype;
    pc.dtype_source = "kernel name";
  } else {
    pc.dtype = default_dtype;
    pc.dtype_source = "default";
  }
  return pc;
}

// A call that names no dtype of its own (nvjet_* GEMMs under NVTX ranges, which record no types;
// cuDNN's attention kernels) takes the one the other kernels of its innermost enclosing range
// name, by kernel time: a module or a step computes in one dtype.
void resolve_dtypes_from_ranges(std::vector<PendingCall>& pending,
                                const std::vector<KernelFacts>& facts, const Profile& profile) {
  std::vector<std::optional<DType>> kernel_dtype(facts.size());
  for (size_t k = 0; k < facts.size(); ++k) {
    if (facts[k].what.op == "other") kernel_dtype[k] = dtype_from_kernel_name(facts[k].name);
  }
  for (const PendingCall& pc : pending) {
    for (const size_t k : pc.call->kernels)
      kernel_dtype[k] = dtype_is_own(pc) ? std::optional(pc.dtype) : std::nullopt;
  }
  std::unordered_map<const ContextOp*, std::map<DType, int64_t>> time_by_dtype;
  for (size_t k = 0; k < facts.size(); ++k) {
    if (!kernel_dtype[k]) continue;
    for (const ContextOp* c : facts[k].context)
      time_by_dtype[c][*kernel_dtype[k]] += profile.kernels[k].duration_ns();
  }
  for (PendingCall& pc : pending) {
    if (dtype_is_own(pc)) continue;
    const KernelFacts& first = facts[pc.call->kernels.front()];
    for (size_t i = first.context.size(); i-- > 0;) {
      const auto found = time_by_dtype.find(first.context[i]);
      if (found == time_by_dtype.end()) {
        // A module range of `kforge profile --torch` names its input's dtype.
        const auto& types = first.context[i]->input_types;
        const auto own = types.empty() ? std::nullopt : dtype_from_torch_type(types.front());
        if (!own) continue;
        pc.dtype = *own;
        pc.dtype_source = "enclosing range";
        pc.dtype_note = fmt::format("dtype of the input of range {}", first.context[i]->name);
        break;
      }
      // A 16-bit type with any time wins, as it does in kernel names: under autocast the
      // float kernels (norms, reductions) can take more time than the bf16 ones around a GEMM.
      const auto rank = [](const std::pair<const DType, int64_t>& d) {
        return std::pair(d.first == DType::bf16 || d.first == DType::f16, d.second);
      };
      const auto most =
          std::max_element(found->second.begin(), found->second.end(),
                           [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
      pc.dtype = most->first;
      pc.dtype_source = "enclosing range";
      pc.dtype_note =
          fmt::format("dtype from the other kernels in range {}", first.context[i]->name);
      break;
    }
  }
}

}  // namespace

std::optional<double> PlanGroup::achieved_gbps() const {
  if (!bytes_per_call || time_ns <= 0) return std::nullopt;
  return *bytes_per_call * static_cast<double>(calls) / static_cast<double>(time_ns);
}

std::optional<double> PlanGroup::achieved_tflops() const {
  if (!flops_per_call || time_ns <= 0) return std::nullopt;
  return *flops_per_call * static_cast<double>(calls) / static_cast<double>(time_ns) * 1e-3;
}

std::optional<Cost> PlanGroup::cost() const {
  if (named_elements && dtype)
    return Cost{static_cast<double>(*named_elements * dtype_size(*dtype)), 0.0};
  if (!sizes || !dtype || op == "other") return std::nullopt;
  Cost cost = find_op(op)->cost(*sizes, *dtype);
  cost.bytes += static_cast<double>(extra_elements * dtype_size(*dtype));
  return cost;
}

bool PlanGroup::extractable() const {
  if (op == "other" || !sizes || !dtype) return false;
  const OpSpec* spec = find_op(op);
  return spec && spec->supports(*dtype);
}

std::string main_device_name(const Profile& profile) {
  std::map<int64_t, int64_t> time_by_device;
  for (const auto& k : profile.kernels)
    time_by_device[k.device] += k.duration_ns();
  int64_t best = -1;
  std::string name;
  for (const auto& [id, time] : time_by_device) {
    for (const auto& d : profile.devices) {
      if (d.id == id && time > best) {
        best = time;
        name = d.name;
      }
    }
  }
  if (name.empty() && profile.devices.size() == 1) name = profile.devices.front().name;
  return name;
}

Plan make_plan(const Profile& profile, const PlanOptions& options) {
  if (options.copy_gbps <= 0) throw Error("planning needs a positive copy ceiling");
  if (profile.kernels.empty()) throw UsageError("the profile holds no kernels");
  Plan plan;
  plan.options = options;
  plan.device = main_device_name(profile);
  plan.kernels = static_cast<int64_t>(profile.kernels.size());
  plan.kernel_time_ns = profile.kernel_time_ns();
  plan.busy_time_ns = profile.busy_time_ns();
  for (const auto& t : profile.transfers)
    plan.transfer_time_ns += t.duration_ns();
  if (plan.kernel_time_ns <= 0) throw UsageError("the profile's kernels took no time");
  for (const auto& k : profile.kernels) {
    if (k.duration_ns() > 0 &&
        (plan.shortest_kernel_ns == 0 || k.duration_ns() < plan.shortest_kernel_ns))
      plan.shortest_kernel_ns = k.duration_ns();
  }

  // Parse every distinct context entry once; classify every kernel.
  std::unordered_map<std::string, ContextOp> parsed;
  KernelClassifier classifier(options.classify);
  std::vector<KernelFacts> facts(profile.kernels.size());
  for (size_t k = 0; k < profile.kernels.size(); ++k) {
    const KernelRecord& kernel = profile.kernels[k];
    KernelFacts& f = facts[k];
    f.name = kernel.demangled.empty() ? std::string_view(kernel.name) : kernel.demangled;
    for (const auto& c : kernel.context) {
      auto [it, inserted] = parsed.try_emplace(context_key(c));
      if (inserted) it->second = parse_context(c);
      f.context.push_back(&it->second);
    }
    f.what = classifier.classify(f.name, f.context);
  }
  // Composite ops and fusion groups among the calls (fusion.h).
  const std::vector<size_t> order = launch_order(profile);
  std::deque<ContextOp> synthetic;
  const Fusions fusions = find_fusions(profile, order, facts, synthetic);

  // Calls -> problems -> groups.
  std::map<std::string, PlanGroup> groups;
  std::map<std::string, std::map<std::string, KernelNameShare>> names_by_group;
  const std::vector<Call> calls = split_into_calls(profile, order, facts);
  std::vector<PendingCall> pending;
  for (const Call& call : calls) {
    const KernelFacts& first = facts[call.kernels.front()];
    const std::string& op = first.what.op;
    if (op == "other" && (first.what.group.empty() || !call.from_context)) {
      // No kforge op: each kernel is its own call, grouped by its name.
      for (const size_t k : call.kernels) {
        const KernelFacts& f = facts[k];
        PlanGroup& g = groups["other\x1e" + std::string(f.name)];
        g.op = "other";
        g.name = "other";
        g.shape = "-";
        g.calls_are_kernels = true;
        g.calls += 1;
        g.kernels += 1;
        g.time_ns += profile.kernels[k].duration_ns();
        count_rule(g, f.what);
        KernelNameShare& share =
            names_by_group["other\x1e" + std::string(f.name)][std::string(f.name)];
        share.name = f.name;
        share.kernels += 1;
        share.time_ns += profile.kernels[k].duration_ns();
      }
      continue;
    }
    pending.push_back(resolve_call(call, facts, fusions, options.default_dtype));
  }
  // Calls whose kernels name no dtype take the one of the kernels around them.
  resolve_dtypes_from_ranges(pending, facts, profile);

  for (const PendingCall& pc : pending) {
    const Call& call = *pc.call;
    const Classification& what = facts[call.kernels.front()].what;
    // The mapped problem's op: a matmul whose call adds a bias is matmul_bias.
    const std::string& op = pc.problem ? pc.problem->op : what.op;
    const OpSpec* spec = find_op(op);
    std::string shape = pc.problem && spec ? spec->format_shape(pc.problem->sizes) : "?";
    if (pc.named) shape = fmt::format("{}", fmt::join(pc.named->shape, "x"));
    const std::string name = pc.fusion ? pc.fusion->name : op == "other" ? what.group : op;
    const std::string key =
        fmt::format("{}\x1e{}\x1e{}\x1e{}", name, op, shape, dtype_name(pc.dtype));
    PlanGroup& g = groups[key];
    if (g.op.empty()) {
      g.op = op;
      g.name = name;
      g.shape = shape;
      g.dtype = pc.dtype;
      g.dtype_source = pc.dtype_source;
      if (pc.problem) g.sizes = pc.problem->sizes;
      if (pc.named) g.named_elements = pc.named->elements;
    }
    if (pc.fusion) {
      g.extra_elements = std::max(g.extra_elements, pc.fusion->extra_elements);
      for (const auto& n : pc.fusion->notes)
        add_unique(g.notes, n);
    }
    g.calls += 1;
    g.calls_are_kernels = g.calls_are_kernels || !call.from_context;
    if (pc.problem) {
      for (const auto& n : pc.problem->notes)
        add_unique(g.notes, n);
    } else if (!pc.named) {
      add_unique(g.unmapped, pc.why_not);
    }
    if (!pc.dtype_note.empty()) add_unique(g.notes, pc.dtype_note);
    for (const size_t k : call.kernels) {
      const KernelFacts& f = facts[k];
      const int64_t ns = profile.kernels[k].duration_ns();
      g.kernels += 1;
      g.time_ns += ns;
      count_rule(g, f.what);
      KernelNameShare& share = names_by_group[key][std::string(f.name)];
      share.name = f.name;
      share.kernels += 1;
      share.time_ns += ns;
    }
  }

  // The compute ceiling: the measured one, unless a GEMM of this run was faster. The measurement
  // (cuBLAS at one shape on random data) can run below what the same GPU reaches at other
  // shapes; a kernel that reached more proves the hardware can. Only the GEMM groups (matmul, its
  // epilogue variants and fused_mlp) count: their FLOPs follow from the shape alone (an attention's
  // depend on an assumed causal flag), and only in 16-bit types, which the ceiling is measured in.
  std::optional<double> matmul_tflops = options.matmul_tflops;
  std::string ceiling_group;  // the key of the group that raised it
  if (matmul_tflops) {
    for (const auto& [key, g] : groups) {
      if (!g.sizes || g.calls == 0 || g.time_ns <= 0) continue;
      const bool gemm = g.op == "matmul" || g.op == "matmul_bias" || g.op == "matmul_residual" ||
                        g.op == "fused_mlp";
      if (!gemm || *g.dtype == DType::f32) continue;
      const Cost cost = *g.cost();
      const bool compute_bound =
          cost.flops / (*options.matmul_tflops * 1e12) > cost.bytes / (options.copy_gbps * 1e9);
      const double achieved = cost.flops * static_cast<double>(g.calls) /
                              static_cast<double>(g.time_ns) * 1e-3;  // FLOP/ns -> TFLOP/s
      if (compute_bound && achieved > *matmul_tflops) {
        matmul_tflops = achieved;
        ceiling_group = key;
      }
    }
    if (!ceiling_group.empty()) {
      plan.raised_matmul_tflops = matmul_tflops;
      const PlanGroup& g = groups.at(ceiling_group);
      plan.raised_by = fmt::format("{} {} {}", g.op, g.shape, dtype_name(*g.dtype));
    }
  }

  // The roofline and Amdahl's law per group.
  const double total = static_cast<double>(plan.kernel_time_ns);
  for (auto& [key, g] : groups) {
    for (auto& [name, share] : names_by_group[key])
      g.kernel_names.push_back(std::move(share));
    std::stable_sort(g.kernel_names.begin(), g.kernel_names.end(),
                     [](const auto& a, const auto& b) { return a.time_ns > b.time_ns; });
    g.share = static_cast<double>(g.time_ns) / total;
    g.gain_bound = g.share < 1 ? 1 / (1 - g.share) : INFINITY;
    const std::optional<Cost> group_cost = g.cost();
    if (!group_cost || g.calls == 0) continue;
    const Cost& cost = *group_cost;
    const double memory_s = cost.bytes / (options.copy_gbps * 1e9);
    const double compute_s = matmul_tflops ? cost.flops / (*matmul_tflops * 1e12) : 0.0;
    const double roofline_ns = std::max(memory_s, compute_s) * 1e9;
    if (roofline_ns <= 0) continue;
    g.bytes_per_call = cost.bytes;
    g.flops_per_call = cost.flops;
    g.bound = compute_s > memory_s ? "compute" : "memory";
    // A call is at least one kernel, and no kernel of this run was shorter than the shortest:
    // below it launch and ramp-up, not bytes or FLOPs, set the time.
    double best_ns = roofline_ns;
    if (static_cast<double>(plan.shortest_kernel_ns) > roofline_ns) {
      best_ns = static_cast<double>(plan.shortest_kernel_ns);
      g.bound = "latency";
      add_unique(g.notes,
                 fmt::format("roofline {:.2f} us is below the shortest kernel of the profile "
                             "({:.2f} us): bounded by that",
                             roofline_ns * 1e-3, best_ns * 1e-3));
    }
    g.best_ns_per_call = best_ns;
    // The group that set the ceiling runs at it by definition (not by rounding).
    g.s_max = key == ceiling_group ? 1.0 : g.ns_per_call() / best_ns;
    // A group already faster than its roofline has nothing to gain.
    const double s = std::max(1.0, *g.s_max);
    g.gain = 1 / ((1 - g.share) + g.share / s);
    if (*g.s_max < 1 && g.bound == "memory") {
      add_unique(g.notes, "faster than the DRAM roofline (inputs likely held in L2): no gain");
    }
    if (key == ceiling_group) {
      add_unique(g.notes, fmt::format("the fastest GEMM of the profile: it sets the matmul "
                                      "ceiling ({:.0f} TFLOP/s), no gain",
                                      *matmul_tflops));
    } else if (*g.s_max < 1 && g.bound == "compute") {
      add_unique(g.notes, fmt::format("faster than the matmul ceiling ({:.0f} TFLOP/s): no gain",
                                      *matmul_tflops));
    }
    if (g.bound == "compute" && *g.dtype == DType::f32) {
      add_unique(g.notes, "compute bound from the bf16 matmul ceiling: f32 cannot reach it");
    }
    if (g.bound == "compute" && !options.matmul_tflops) {
      add_unique(g.notes, "no matmul ceiling measured: memory bound only");
    }
  }

  // Rank: groups with a gain by gain, then the rest by time; cumulative gain down the ranking.
  for (auto& [key, g] : groups)
    plan.groups.push_back(std::move(g));
  std::stable_sort(plan.groups.begin(), plan.groups.end(), [](const auto& a, const auto& b) {
    if (a.gain.has_value() != b.gain.has_value()) return a.gain.has_value();
    if (a.gain && *a.gain != *b.gain) return *a.gain > *b.gain;
    return a.time_ns > b.time_ns;
  });
  double fixed_share = 0;
  double fixed_time = 0;  // sum of f / s over the fixed groups
  for (size_t i = 0; i < plan.groups.size(); ++i) {
    PlanGroup& g = plan.groups[i];
    g.rank = static_cast<int>(i) + 1;
    if (!g.gain) continue;
    fixed_share += g.share;
    fixed_time += g.share / std::max(1.0, *g.s_max);
    g.cumulative_gain = 1 / ((1 - fixed_share) + fixed_time);
    plan.all_fixed_gain = *g.cumulative_gain;
  }
  for (const PlanGroup& g : plan.groups) {
    if (g.op != "other") {
      plan.op_share += g.share;
      if (g.sizes) plan.op_share_with_problem += g.share;
    } else if (g.name != "other") {
      plan.named_share += g.share;
    } else {
      plan.other_share += g.share;
    }
  }
  return plan;
}

nlohmann::json plan_to_json(const Plan& plan) {
  using nlohmann::json;
  const auto optional = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  json groups = json::array();
  for (const PlanGroup& g : plan.groups) {
    json names = json::array();
    for (const auto& n : g.kernel_names)
      names.push_back({{"name", n.name}, {"kernels", n.kernels}, {"time_ns", n.time_ns}});
    json rules = json::object();
    for (const auto& [id, use] : g.rules)
      rules[id] = {{"kernels", use.kernels}, {"evidence", use.evidence}, {"reason", use.reason}};
    groups.push_back({
        {"rank", g.rank},
        {"op", g.op},
        {"name", g.name},
        {"shape", g.shape},
        {"sizes", g.sizes ? json(*g.sizes) : json(nullptr)},
        {"dtype", g.dtype ? json(dtype_name(*g.dtype)) : json(nullptr)},
        {"dtype_source", g.dtype ? json(g.dtype_source) : json(nullptr)},
        {"calls", g.calls},
        {"calls_are_kernels", g.calls_are_kernels},
        {"kernels", g.kernels},
        {"time_ns", g.time_ns},
        {"share", g.share},
        {"us_per_call", g.ns_per_call() * 1e-3},
        {"bytes_per_call", optional(g.bytes_per_call)},
        {"flops_per_call", optional(g.flops_per_call)},
        {"achieved_gbps", optional(g.achieved_gbps())},
        {"achieved_tflops", optional(g.achieved_tflops())},
        {"bound", g.bound.empty() ? json(nullptr) : json(g.bound)},
        {"best_us_per_call", g.best_ns_per_call ? json(*g.best_ns_per_call * 1e-3) : json(nullptr)},
        {"s_max", optional(g.s_max)},
        {"gain", optional(g.gain)},
        {"cumulative_gain", optional(g.cumulative_gain)},
        {"gain_bound", std::isfinite(g.gain_bound) ? json(g.gain_bound) : json(nullptr)},
        {"extractable", g.extractable()},
        {"kernel_names", names},
        {"rules", rules},
        {"notes", g.notes},
        {"unmapped", g.unmapped},
    });
  }
  return {{"device", plan.device},
          {"ceilings",
           {{"copy_gbps", plan.options.copy_gbps},
            {"matmul_tflops", optional(plan.options.matmul_tflops)},
            {"source", plan.options.ceilings_source}}},
          {"default_dtype", dtype_name(plan.options.default_dtype)},
          {"split_mlp", plan.options.classify.split_mlp},
          {"kernels", plan.kernels},
          {"kernel_time_ns", plan.kernel_time_ns},
          {"busy_time_ns", plan.busy_time_ns},
          {"transfer_time_ns", plan.transfer_time_ns},
          {"shortest_kernel_ns", plan.shortest_kernel_ns},
          {"raised_matmul_tflops", optional(plan.raised_matmul_tflops)},
          {"raised_by", plan.raised_by.empty() ? json(nullptr) : json(plan.raised_by)},
          {"all_fixed_gain", plan.all_fixed_gain},
          {"op_share", plan.op_share},
          {"op_share_with_problem", plan.op_share_with_problem},
          {"named_share", plan.named_share},
          {"other_share", plan.other_share},
          {"groups", groups}};
}

nlohmann::json task_to_json(const Plan& plan, const PlanGroup& group,
                            const fs::path& profile_path) {
  nlohmann::json names = nlohmann::json::array();
  for (const auto& n : group.kernel_names)
    names.push_back(n.name);
  std::error_code ec;
  const fs::path absolute = fs::absolute(profile_path, ec);
  return {{"op", group.op},
          {"shape", group.shape},
          {"dtype", dtype_name(*group.dtype)},
          {"rank", group.rank},
          {"baseline_us", group.ns_per_call() * 1e-3},
          {"calls", group.calls},
          {"calls_are_kernels", group.calls_are_kernels},
          {"share", group.share},
          {"best_us", group.best_ns_per_call ? *group.best_ns_per_call * 1e-3 : 0.0},
          {"s_max", group.s_max.value_or(0)},
          {"gain", group.gain.value_or(1)},
          {"kernel_names", names},
          {"notes", group.notes},
          {"device", plan.device},
          {"profile", (ec ? profile_path : absolute).string()}};
}

PlanTask read_task_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw UsageError(fmt::format("cannot read task file {}", path.string()));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("{} is not JSON: {}", path.string(), e.what()));
  }
  PlanTask task;
  for (const auto& [field, out] : {std::pair{"op", &task.op}, std::pair{"shape", &task.shape},
                                   std::pair{"dtype", &task.dtype}}) {
    if (!j.contains(field) || !j.at(field).is_string())
      throw UsageError(fmt::format("task file {} has no \"{}\" string", path.string(), field));
    *out = j.at(field).get<std::string>();
  }
  return task;
}

}  // namespace kforge
