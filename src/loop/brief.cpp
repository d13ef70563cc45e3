#include "loop/brief.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/text.h"
#include "ops/op_spec.h"

namespace kforge {

std::string task_brief(const BriefInputs& in) {
  const OpSpec& op = *in.task.op;
  std::string out = fmt::format("# Task {}: {} {} {}\n\n", in.task_name, op.name(),
                                op.format_shape(in.task.sizes), dtype_name(in.task.dtype));
  out += fmt::format("Op: {}\n\nTensors (inputs, then outputs):\n", op.formula());
  for (const TensorSpec& t : op.tensors()) {
    out +=
        fmt::format("- {}{} [{}]\n", t.is_output ? "output " : "", t.name, fmt::join(t.dims, ", "));
  }
  const nlohmann::json device = in.ceilings.raw.value("device", nlohmann::json::object());
  out += fmt::format("\nDevice: {}; measured copy ceiling {:.0f} GB/s", device.value("name", "?"),
                     in.ceilings.copy_gbps);
  if (in.ceilings.matmul_tflops)
    out += fmt::format(", matmul ceiling {:.1f} TFLOP/s", *in.ceilings.matmul_tflops);
  out += ".\n\n";

  // Where the best stands: its time and share of the roofline bound, as last timed.
  const nlohmann::json timing = best_timing(in.history);
  const double best_time_us = timing.value("median_us", 0.0);
  const double roofline = timing.value("roofline_fraction", 0.0);
  out +=
      fmt::format("Kernel file to edit (the best version so far): {}\n", in.kernel_path.string());
  if (best_time_us > 0) {
    out += fmt::format(
        "Best: {:.2f} us, {:.0f}% of its roofline bound ({:.2f} us at the ceilings)."
        "\n",
        best_time_us, 100 * roofline, best_time_us * roofline);
  } else {
    out += "Best: not timed yet (the first experiment times it beside the proposal).\n";
  }

  const auto kept = std::count_if(in.history.begin(), in.history.end(),
                                  [](const ExperimentRecord& r) { return r.kept; });
  const int in_a_row = not_kept_in_a_row(in.history);
  out += fmt::format("\n## Experiments: {} so far, {} kept, {} in a row not kept",
                     in.history.size(), kept, in_a_row);
  if (in.rules.max_consecutive_reverts > 0)
    out += fmt::format(" (the loop moves on at {})", in.rules.max_consecutive_reverts);
  out += "\n\n";
  const size_t first = in.history.size() > in.recent ? in.history.size() - in.recent : 0;
  for (size_t i = first; i < in.history.size(); ++i) {
    const ExperimentRecord& r = in.history[i];
    out += fmt::format("- #{} {}{} ({}): {}\n", r.number, r.verdict,
                       r.time_us > 0 ? fmt::format(" {:.2f} us", r.time_us) : "", r.proposer,
                       first_lines(r.note));
    if (r.fields.contains("failing_stage")) {
      out += fmt::format("  failed at {}: {}\n", r.fields.at("failing_stage").get<std::string>(),
                         first_lines(r.fields.value("detail", "")));
    }
    if (r.fields.contains("mismatches")) {
      std::string listed;
      for (const nlohmann::json& m :
           r.fields["mismatches"].value("first_mismatches", nlohmann::json::array())) {
        listed += fmt::format("{}{} got {:.6g} expected {:.6g}", listed.empty() ? "" : "; ",
                              m.value("index", nlohmann::json::array()).dump(), m.value("got", 0.0),
                              m.value("expected", 0.0));
      }
      if (!listed.empty()) out += fmt::format("  first mismatches: {}\n", listed);
    }
    if (r.fields.contains("compiler_log")) {
      std::string log = first_lines(r.fields.at("compiler_log").get<std::string>(), 6);
      while (!log.empty() && log.back() == '\n')
        log.pop_back();
      out += fmt::format("  compiler:\n```\n{}\n```\n", log);
    }
  }
  if (in.submit_command.empty()) return out;
  out += fmt::format(
      "\n## Next\n\nWrite a new version of the whole kernel file and submit it:\n\n    {}\n\n"
      "It is built, checked in five stages (smoke, shape sweep, stability, determinism, edge "
      "cases) under the integrity rules, timed beside the best in the same run, and kept only if "
      "faster beyond both timings' spreads and by more than 1%.\n",
      in.submit_command);
  return out;
}

}  // namespace kforge
