// What kforge and a worker say to each other: one JSON object per line, on a private channel
// (two descriptors named by `--channel IN,OUT`; the worker's stdin is /dev/null, its stdout and
// stderr a log kforge reads per request). Every request carries a sequence number "seq" that
// its reply repeats.
//
//   {"op":"hello"}                                  -> {"ok":true,"device":{...},"threads":N}
//   {"op":"run","module":M,"region":R,"tensors":[...],"scalars":[...]}
//                                                   -> {"ok":true,"guard_violations":[...],
//                                                       "inputs_modified":[...]}
//   {"op":"measure", ...as run..., "settings":{...}, "fresh":[...], "seed":S}
//       (or "library":O with "op_name", "sizes" instead of "module", for a cuBLAS baseline)
//                                                   -> {"ok":true,"samples":[...],...}
//   {"op":"replay","index":I}                       -> {"ok":true,"digest":D,...}; the sample's
//                                                      inputs and outputs in the region
//   {"op":"ceilings"}                               -> {"ok":true,"ceilings":{...}}
//   {"op":"reference","op_name":O,"sizes":{...},"scalars":[...],"region":R,"tensors":[...]}
//                                                   -> {"ok":true}; f32 outputs in the region
//
// A failed request answers {"ok":false,"kind":K,"error":TEXT}, K one of: "oom", "fault" (device
// code failed; the worker exits after answering), "status" (the entry returned non-zero),
// "load" (the module does not load), "invalid" (the candidate broke a rule of the
// measurement), "fatal" (the same, with work of its own still running: the worker exits after
// answering), "error" (anything else).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/fresh_values.h"

namespace kforge {

// A tensor inside a shared region.
struct TensorRef {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  size_t offset = 0;  // bytes from the region's start
  size_t bytes = 0;
  bool is_output = false;
};

void to_json(nlohmann::json& j, const TensorRef& t);
void from_json(const nlohmann::json& j, TensorRef& t);

struct BenchSettings {
  double warmup_seconds = 0.05;
  size_t min_samples = 20;
  size_t max_samples = 5000;
  double min_seconds = 0.05;
  double max_seconds = 3.0;
  double target_rel_stderr = 0.002;
  bool cold_cache = true;
};

void to_json(nlohmann::json& j, const BenchSettings& s);
void from_json(const nlohmann::json& j, BenchSettings& s);

// How a measurement redraws each input (core/fresh_values.h), as requests carry it.
void to_json(nlohmann::json& j, const FreshInput& f);
void from_json(const nlohmann::json& j, FreshInput& f);

struct WorkerFlags {
  std::string backend;
  int device = 0;
  std::string channel;   // "IN,OUT"
  long long parent = 0;  // kforge's pid
  int cpu_core = -1;     // >= 0: the worker runs on this core only (a CPU backend slot)
};

// Entry point of `kforge __worker`. Returns the process exit code.
int run_worker(const WorkerFlags& flags);

}  // namespace kforge
