// What happened to a candidate. Every run of candidate code ends in exactly one of these.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kforge {

enum class Verdict {
  ok,
  wrong,          // ran, but the output is wrong (values, unwritten elements, writes out of bounds)
  crash,          // the worker died or device code faulted
  timeout,        // no answer in time; the worker was killed
  oom,            // an allocation failed
  compile_error,  // the variant does not compile or its module does not load
  rejected,       // a constraint of the kernel file rules the variant out; never compiled
  invalid,        // broke a rule of the measurement (work outside the given stream, results
                  // reused across calls, a time beyond the device's limits, ...): no time
};

std::string_view verdict_name(Verdict v);  // "OK", "WRONG", ...
// The inverse of verdict_name; nullopt for any other text.
std::optional<Verdict> parse_verdict(std::string_view name);

}  // namespace kforge
