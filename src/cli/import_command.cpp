#include "cli/import_command.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "core/error.h"
#include "core/run_info.h"

namespace kforge {
namespace {

double to_ms(int64_t ns) {
  return static_cast<double>(ns) * 1e-6;
}

// Long kernel names (templated C++) cut to a width that keeps a table readable.
std::string shortened(const std::string& text, size_t width) {
  if (text.size() <= width) return text;
  return text.substr(0, width - 3) + "...";
}

struct KernelGroup {
  std::string name;
  int64_t calls = 0;
  int64_t total_ns = 0;
  std::map<std::string, int64_t> launched_from;  // innermost context name -> calls
};

// The op most calls of a kernel were launched from ("-" when none carried context).
std::string usual_op(const KernelGroup& g) {
  std::string best = "-";
  int64_t most = 0;
  for (const auto& [name, calls] : g.launched_from) {
    if (calls > most) {
      best = name;
      most = calls;
    }
  }
  return best;
}

}  // namespace

CLI::Option* add_torch_trace_options(CLI::App* cmd, TorchTraceFlags& flags) {
  return cmd
      ->add_option("--torch-trace", flags.trace,
                   "Import this torch.profiler Chrome trace (prof.export_chrome_trace) instead "
                   "of running a command")
      ->check(CLI::ExistingFile);
}

CLI::App* add_import_torch_trace_command(CLI::App& app, TorchTraceFlags& flags) {
  auto* cmd = app.add_subcommand(
      "import-torch-trace",
      "Import a torch.profiler Chrome trace as a kforge profile (kernels with their ATen ops, "
      "input shapes and module ranges)");
  cmd->group("");  // kept for scripts; `kforge profile --torch-trace FILE` is the documented form
  cmd->add_option("trace", flags.trace, "Chrome trace JSON (prof.export_chrome_trace)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", flags.out, "Where to write the kforge profile")->capture_default_str();
  cmd->add_option("--top", flags.top, "Kernels listed in the summary")->capture_default_str();
  return cmd;
}

void print_torch_trace_summary(const TorchTraceImport& import, const std::string& trace_name,
                               size_t top) {
  const Profile& p = import.profile;
  fmt::print("{:<12} {}: {} kernels, {} transfers; {} CPU ops and {} annotations as context\n",
             "torch trace", trace_name, p.kernels.size(), p.transfers.size(), import.cpu_ops,
             import.user_annotations);
  for (const auto& d : p.devices) {
    fmt::print("{:<12} {}: {} (sm_{}{}, {} SMs)\n", "device", d.id, d.name, d.compute_major,
               d.compute_minor, d.sm_count);
  }
  if (p.kernels.empty()) {
    fmt::print(
        "no GPU kernels in the trace: record it with activities=[ProfilerActivity.CPU, "
        "ProfilerActivity.CUDA] around GPU work\n");
    return;
  }
  fmt::print("{:<12} {:.3f} ms (sum of kernel durations)\n", "kernel time",
             to_ms(p.kernel_time_ns()));
  fmt::print("{:<12} {:.3f} ms (a kernel or transfer running; union per device)\n", "busy time",
             to_ms(p.busy_time_ns()));
  int64_t with_dims = 0;
  for (const auto& k : p.kernels) {
    const bool has_dims = std::any_of(k.context.begin(), k.context.end(),
                                      [](const OpContext& c) { return !c.input_dims.empty(); });
    with_dims += has_dims ? 1 : 0;
  }
  fmt::print(
      "{:<12} {} kernels linked to their launch ({} by correlation, {} by external id), {} "
      "unlinked; {} with input shapes\n",
      "context", import.linked_by_correlation + import.linked_by_external_id,
      import.linked_by_correlation, import.linked_by_external_id, import.unlinked, with_dims);

  std::map<std::string, KernelGroup> groups;
  for (const auto& k : p.kernels) {
    KernelGroup& g = groups[k.name];
    g.name = k.name;
    ++g.calls;
    g.total_ns += k.duration_ns();
    if (!k.context.empty()) ++g.launched_from[k.context.back().name];
  }
  std::vector<const KernelGroup*> ranked;
  for (const auto& [name, g] : groups)
    ranked.push_back(&g);
  std::sort(ranked.begin(), ranked.end(), [](const KernelGroup* a, const KernelGroup* b) {
    return a->total_ns != b->total_ns ? a->total_ns > b->total_ns : a->name < b->name;
  });
  const double kernel_ns = static_cast<double>(p.kernel_time_ns());
  fmt::print("\n{:>4} {:>10} {:>7} {:>7} {:>10}  {:<28} {}\n", "rank", "total ms", "share", "calls",
             "mean us", "launched from", "kernel");
  for (size_t i = 0; i < std::min(top, ranked.size()); ++i) {
    const KernelGroup& g = *ranked[i];
    const double share = kernel_ns > 0 ? 100.0 * static_cast<double>(g.total_ns) / kernel_ns : 0.0;
    fmt::print("{:>4} {:>10.3f} {:>6.1f}% {:>7} {:>10.2f}  {:<28} {}\n", i + 1, to_ms(g.total_ns),
               share, g.calls, to_ms(g.total_ns) * 1e3 / static_cast<double>(g.calls),
               shortened(usual_op(g), 28), shortened(g.name, 90));
  }
  if (ranked.size() > top) fmt::print("     ... {} more kernel names\n", ranked.size() - top);
}

int cmd_import_torch_trace(const TorchTraceFlags& flags, const std::vector<std::string>& argv) {
  if (flags.out.empty()) throw UsageError("--out: give the file to write the profile to");
  TorchTraceImport import = read_torch_trace(flags.trace);
  // Where the profile came from, beside the trace's own facts (kept under "torch_trace").
  const nlohmann::json trace_facts = import.profile.metadata["torch_trace"];
  import.profile.metadata = run_metadata(argv);
  import.profile.metadata["torch_trace"] = trace_facts;
  print_torch_trace_summary(import, flags.trace, flags.top);
  write_profile(import.profile, flags.out);
  fmt::print("\nwrote {}\n", flags.out);
  return 0;
}

}  // namespace kforge
