#include "cli/import_command.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "core/run_info.h"
#include "profile/summary.h"

namespace kforge {

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
  if (p.kernels.empty()) {
    fmt::print(
        "no GPU kernels in the trace: record it with activities=[ProfilerActivity.CPU, "
        "ProfilerActivity.CUDA] around GPU work\n");
    return;
  }
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
  fmt::print("{}", profile_summary(p, top));
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
