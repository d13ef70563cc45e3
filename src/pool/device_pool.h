// Every device of a host that a tune runs on: one lane per GPU (or per CPU backend slot), each
// with its own worker process and checker, all sharing one compiler.
//
// Lanes of one pool are the same device model (device_key() equal): a pool of mixed GPUs is
// refused, since their timings would rank variants by the GPU they happened to run on. Whether
// same-model lanes also time alike is a measured question (see calibrate_lanes in
// tune/tuner.cpp and docs/multi-gpu.md).
//
// A lane can be lost: a GPU that falls off the bus or reports an Xid error cannot start a
// worker any more. probe() tells a lost lane from a candidate that crashed its worker: it starts
// a fresh worker and asks it for its device; a lane that cannot is marked lost and its work
// goes to the others.
//
// CPU slots are pinned, slot i to core i (modulo the cores), so that two slots timed side by
// side do not share a core. The compiler's jobs still share the cores, as they do on one slot.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "check/checker.h"
#include "compile/compiler.h"
#include "run/worker_client.h"

namespace kforge {

struct DeviceLane {
  int index = 0;  // the CUDA device, or the CPU slot
  std::unique_ptr<WorkerClient> worker;
  std::unique_ptr<Checker> checker;
  std::string name;  // "cuda:1 (GPU-5f3c...)", "cpu:0": where an evaluation ran
  bool lost = false;
  std::string lost_reason;
};

// "0,2,3" or "all": the device indices to use. `all` is every CUDA device the runtime sees, or
// every CPU core for the CPU backend (slots). Throws UsageError on a malformed list, a repeated
// index or an index beyond the devices present.
std::vector<int> parse_device_list(const std::string& text, const std::string& backend);

class DevicePool {
 public:
  // Starts a worker on every device of `indices` (on `backend`); `base` gives the other worker
  // options (the executable, a launcher). Throws UsageError when the devices are not all the
  // same model, Error when a worker does not start.
  DevicePool(const std::string& backend, const std::vector<int>& indices, const Compiler& compiler,
             const WorkerOptions& base = {});

  size_t size() const { return lanes_.size(); }
  DeviceLane& lane(size_t i) { return *lanes_[i]; }
  // Lanes not lost, in index order.
  std::vector<DeviceLane*> live_lanes();
  // The first lane not lost; throws Error when every lane is lost.
  DeviceLane& first_live();
  // The device every lane is (the first lane's description).
  const DeviceInfo& device() const { return device_; }
  const std::string& backend() const { return backend_; }

  // Whether `lane` still works: a fresh worker starts on it and answers. A lane that does not
  // is marked lost, with why; a lost lane stays lost.
  bool probe(DeviceLane& lane);

 private:
  std::string backend_;
  DeviceInfo device_;
  std::vector<std::unique_ptr<DeviceLane>> lanes_;
};

}  // namespace kforge
