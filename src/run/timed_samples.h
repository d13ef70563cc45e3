// Worker side of a measurement (docs/integrity.md): the candidate's call made repeatable (on
// CUDA: captured into a graph, with work outside the given stream refused), then samples until
// the stopping rule is met. Before every sample the inputs are redrawn on the device from a seed
// nobody can predict and the outputs are poisoned; after it, a digest of the outputs is taken
// and any element left unwritten ends the sampling. A few probes sit among the samples: repeats
// of the previous sample's inputs (a kernel that reuses work shows up as faster there) and a
// trap that changes a few of them, kept inputs too (a kernel that reuses work, or reads its own
// copy of the inputs kforge does not redraw, returns the old outputs). The
// session is kept until the next request, so kforge can ask for any sample again (`replay`)
// and check it against the reference.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/backend.h"
#include "run/device_tensors.h"
#include "run/protocol.h"

namespace kforge {

// The call once as it is (whatever a kernel initializes lazily, such as its workspace or
// function attributes, happens here), then made repeatable (DeviceBackend::make_repeatable),
// so that what is repeated is the steady call. Every checked or timed run goes through this.
std::unique_ptr<RepeatableCall> make_steady_repeatable(DeviceBackend& backend,
                                                       const std::function<void()>& call,
                                                       std::span<const DeviceSpan> outputs);

// A plain timed sample, or a probe among them: the previous sample's inputs again (repeat), or
// with a few of them changed (trap).
enum class SampleKind { timed, repeat, trap };

// What sits among the timed samples, at positions drawn from the measurement's seed.
struct ProbePlan {
  int repeats = 3;
  int traps = 1;
};

class TimedSession {
 public:
  // `call` runs the candidate (or library) once on `tensors`; it has not run yet. `fresh` says
  // how each input is redrawn. Throws IntegrityViolation when the call cannot be made
  // repeatable (see DeviceBackend::make_repeatable).
  TimedSession(DeviceBackend& backend, std::unique_ptr<DeviceTensors> tensors,
               std::function<void()> call, std::vector<FreshInput> fresh);

  // Warm-up, then samples until `settings`' stopping rule is met: {"samples": [...], ...}.
  nlohmann::json measure(const BenchSettings& settings, uint64_t seed, const ProbePlan& probes);
  // Sample `index` again exactly as it was taken (same inputs, same procedure), then its inputs
  // and outputs into the shared region: {"digest", "poisoned", "inputs_changed", ...}.
  nlohmann::json replay(size_t index);

 private:
  struct Sample {
    SampleKind kind = SampleKind::timed;
    size_t inputs_from = 0;  // the sample whose inputs this one uses (itself, or the one before)
    uint64_t trap_seed = 0;  // a trap's changed elements and their values come from this
  };

  // Device memory of the backend's, released with the session.
  struct Release {
    DeviceBackend* backend;
    void operator()(void* p) const { backend->release(p); }
  };
  using DeviceCopy = std::unique_ptr<void, Release>;

  uint64_t inputs_seed(size_t index) const;
  // Copies of the kept inputs a trap changes entries of (per input, or null), taken before the
  // first call.
  std::vector<DeviceCopy> back_up_kept_inputs();
  void prepare_inputs(const Sample& sample);
  // Poisoned outputs, then the timed launch; returns milliseconds.
  double launch_timed();
  // One sample: its inputs, then launch_timed().
  double take(const Sample& sample);

  DeviceBackend& backend_;
  std::unique_ptr<DeviceTensors> tensors_;
  std::function<void()> call_;
  std::vector<FreshInput> fresh_;
  std::vector<DeviceSpan> inputs_;
  std::vector<DeviceSpan> outputs_;
  std::vector<DeviceSpan> buffers_;             // every tensor: what a cold sample evicts
  std::vector<DeviceCopy> kept_backups_;        // per input: its copy, or null
  bool kept_changed_ = false;                   // a trap changed a kept input since restored
  std::unique_ptr<RepeatableCall> repeatable_;  // made last: it needs the ones above
  uint64_t seed_ = 0;
  bool cold_cache_ = true;
  std::vector<Sample> samples_;
};

}  // namespace kforge
