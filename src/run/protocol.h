// What kforge and a worker say to each other: one JSON object per line. kforge writes requests
// to the worker's stdin; the worker answers on fd 3.
//
//   {"op":"hello"}                                  -> {"ok":true,"device":{...}}
//   {"op":"run","module":M,"region":R,"tensors":[...],"scalars":[...]}
//                                                   -> {"ok":true,"guard_violations":[...],
//                                                       "inputs_modified":[...]}
//   {"op":"bench", ...as run..., "settings":{...}}  -> {"ok":true,"samples_ms":[...],...}
//   {"op":"ceilings"}                               -> {"ok":true,"ceilings":{...}}
//   {"op":"baseline","op_name":O,"sizes":{...},"region":R,"tensors":[...],"settings":{...}}
//                                                   -> as bench, timing cuBLAS (matmul, MLP)
//   {"op":"reference","op_name":O,"sizes":{...},"scalars":[...],"region":R,"tensors":[...]}
//                                                   -> {"ok":true}; f32 outputs in the region
//
// A failed request answers {"ok":false,"kind":K,"error":TEXT}, K one of: "oom", "fault" (device
// code failed; the worker exits after answering), "status" (the entry returned non-zero),
// "load" (the module does not load), "error" (anything else).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

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

// Entry point of `kforge __worker`. Returns the process exit code.
int run_worker(const std::string& backend, int device);

}  // namespace kforge
