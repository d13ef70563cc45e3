// The worker: loads kernel modules and runs them on one device, on kforge's behalf. Anything a
// candidate does wrong (crash, hang, illegal access, running out of memory) happens here, and
// kforge sees it as a verdict.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "bench/statistics.h"
#include "core/error.h"
#include "core/process.h"
#include "device/backend.h"
#include "device/cublas_ops.h"
#include "kforge/kernel.h"
#include "run/protocol.h"
#include "run/shared_region.h"

namespace kforge {

void to_json(nlohmann::json& j, const TensorRef& t) {
  j = {{"name", t.name},   {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"offset", t.offset},
       {"bytes", t.bytes}, {"output", t.is_output}};
}

void from_json(const nlohmann::json& j, TensorRef& t) {
  j.at("name").get_to(t.name);
  t.dtype = parse_dtype(j.at("dtype").get<std::string>()).value();
  j.at("shape").get_to(t.shape);
  j.at("offset").get_to(t.offset);
  j.at("bytes").get_to(t.bytes);
  j.at("output").get_to(t.is_output);
}

void to_json(nlohmann::json& j, const BenchSettings& s) {
  j = {{"warmup_seconds", s.warmup_seconds}, {"min_samples", s.min_samples},
       {"max_samples", s.max_samples},       {"min_seconds", s.min_seconds},
       {"max_seconds", s.max_seconds},       {"target_rel_stderr", s.target_rel_stderr},
       {"cold_cache", s.cold_cache}};
}

void from_json(const nlohmann::json& j, BenchSettings& s) {
  j.at("warmup_seconds").get_to(s.warmup_seconds);
  j.at("min_samples").get_to(s.min_samples);
  j.at("max_samples").get_to(s.max_samples);
  j.at("min_seconds").get_to(s.min_seconds);
  j.at("max_seconds").get_to(s.max_seconds);
  j.at("target_rel_stderr").get_to(s.target_rel_stderr);
  j.at("cold_cache").get_to(s.cold_cache);
}

namespace {

using Entry = int (*)(const kf_args*);
using Clock = std::chrono::steady_clock;

// Bytes on each side of every device tensor, filled with a pattern and checked after a run: a
// kernel that writes outside its tensors is caught even when it does not crash.
constexpr size_t kGuardBytes = 4096;
constexpr unsigned char kGuardPattern = 0xCD;

class StatusError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class LoadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Module {
 public:
  explicit Module(const std::string& path) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) throw LoadError(fmt::format("dlopen {}: {}", path, dlerror()));
    entry_ = reinterpret_cast<Entry>(dlsym(handle_, KFORGE_ENTRY_SYMBOL));
    if (!entry_) {
      throw LoadError(fmt::format("{} does not export '{}' (declare it with KFORGE_ENTRY)", path,
                                  KFORGE_ENTRY_SYMBOL));
    }
  }
  // Modules stay loaded for the worker's life: unloading a CUDA module while the runtime holds
  // its kernels registered is not worth the risk.
  Entry entry() const { return entry_; }

 private:
  void* handle_ = nullptr;
  Entry entry_ = nullptr;
};

// One tensor on the device with guard bands on both sides.
struct DeviceTensor {
  TensorRef ref;
  std::byte* base = nullptr;  // start of the allocation (the leading guard)
  std::byte* data() const { return base + kGuardBytes; }
};

// The tensors of one request, on the device, freed on destruction.
class DeviceTensors {
 public:
  DeviceTensors(DeviceBackend& backend, const SharedRegion& region,
                const std::vector<TensorRef>& refs)
      : backend_(backend), region_(region) {
    std::vector<std::byte> guard(kGuardBytes, std::byte{kGuardPattern});
    for (const auto& ref : refs) {
      DeviceTensor t{ref, static_cast<std::byte*>(backend_.allocate(ref.bytes + 2 * kGuardBytes))};
      tensors_.push_back(t);
      backend_.copy_to_device(t.base, guard.data(), kGuardBytes);
      backend_.copy_to_device(t.data() + ref.bytes, guard.data(), kGuardBytes);
    }
    upload();
  }
  ~DeviceTensors() {
    for (auto& t : tensors_)
      backend_.release(t.base);
  }
  DeviceTensors(const DeviceTensors&) = delete;
  DeviceTensors& operator=(const DeviceTensors&) = delete;

  // Inputs, and the NaN-poisoned outputs kforge prepared, from the shared region.
  void upload() {
    for (auto& t : tensors_) {
      backend_.copy_to_device(t.data(), region_.data() + t.ref.offset, t.ref.bytes);
    }
  }

  kf_args args(const std::vector<double>& scalars, void* stream) {
    abi_inputs_.clear();
    abi_outputs_.clear();
    for (auto& t : tensors_) {
      kf_tensor k{};
      k.data = t.data();
      k.dtype = to_abi(t.ref.dtype);
      k.ndim = static_cast<int32_t>(t.ref.shape.size());
      int64_t stride = 1;
      for (int d = k.ndim - 1; d >= 0; --d) {
        k.shape[d] = t.ref.shape[d];
        k.stride[d] = stride;
        stride *= t.ref.shape[d];
      }
      (t.ref.is_output ? abi_outputs_ : abi_inputs_).push_back(k);
    }
    scalars_ = scalars;
    kf_args a{};
    a.abi_version = KFORGE_ABI_VERSION;
    a.num_inputs = static_cast<int32_t>(abi_inputs_.size());
    a.inputs = abi_inputs_.data();
    a.num_outputs = static_cast<int32_t>(abi_outputs_.size());
    a.outputs = abi_outputs_.data();
    a.num_scalars = static_cast<int32_t>(scalars_.size());
    a.scalars = scalars_.data();
    a.stream = stream;
    return a;
  }

  // Device pointers of the inputs (or outputs), in order.
  std::vector<void*> pointers(bool outputs) const {
    std::vector<void*> out;
    for (const auto& t : tensors_) {
      if (t.ref.is_output == outputs) out.push_back(t.data());
    }
    return out;
  }

  // Outputs back into the shared region; reports guard bands overwritten and inputs changed.
  void download(nlohmann::json& reply) {
    nlohmann::json guards = nlohmann::json::array();
    nlohmann::json modified = nlohmann::json::array();
    std::vector<std::byte> guard(kGuardBytes);
    std::vector<std::byte> scratch;
    for (auto& t : tensors_) {
      for (const bool after : {false, true}) {
        backend_.copy_to_host(guard.data(), after ? t.data() + t.ref.bytes : t.base, kGuardBytes);
        for (size_t i = 0; i < kGuardBytes; ++i) {
          if (guard[i] != std::byte{kGuardPattern}) {
            const long long offset =
                after ? static_cast<long long>(i)
                      : static_cast<long long>(i) - static_cast<long long>(kGuardBytes);
            guards.push_back({{"tensor", t.ref.name},
                              {"where", after ? "after the end" : "before the start"},
                              {"byte_offset", offset}});
            break;
          }
        }
      }
      if (t.ref.is_output) {
        backend_.copy_to_host(region_.data() + t.ref.offset, t.data(), t.ref.bytes);
      } else {
        scratch.resize(t.ref.bytes);
        backend_.copy_to_host(scratch.data(), t.data(), t.ref.bytes);
        if (std::memcmp(scratch.data(), region_.data() + t.ref.offset, t.ref.bytes) != 0) {
          modified.push_back(t.ref.name);
        }
      }
    }
    reply["guard_violations"] = guards;
    reply["inputs_modified"] = modified;
  }

 private:
  DeviceBackend& backend_;
  const SharedRegion& region_;
  std::vector<DeviceTensor> tensors_;
  std::vector<kf_tensor> abi_inputs_;
  std::vector<kf_tensor> abi_outputs_;
  std::vector<double> scalars_;
};

class Worker {
 public:
  explicit Worker(std::unique_ptr<DeviceBackend> backend) : backend_(std::move(backend)) {}

  nlohmann::json handle(const nlohmann::json& request) {
    const std::string op = request.at("op");
    if (op == "hello") return {{"ok", true}, {"device", backend_->info()}, {"pid", getpid()}};
    if (op == "ceilings") return {{"ok", true}, {"ceilings", backend_->measure_ceilings()}};
    if (op == "run") return run(request);
    if (op == "bench") return bench(request);
    if (op == "baseline") return baseline(request);
    if (op == "reference") return reference(request);
    throw Error(fmt::format("unknown request '{}'", op));
  }

 private:
  Entry entry_for(const std::string& path) {
    auto it = modules_.find(path);
    if (it == modules_.end()) it = modules_.emplace(path, std::make_unique<Module>(path)).first;
    return it->second->entry();
  }

  // The tensors a request names and the shared region they live in.
  struct RequestTensors {
    std::vector<TensorRef> refs;
    SharedRegion region;
  };
  static RequestTensors open_tensors(const nlohmann::json& request) {
    return {request.at("tensors").get<std::vector<TensorRef>>(),
            SharedRegion::open(request.at("region"), request.at("region_bytes"))};
  }

  struct Prepared {
    Entry entry;
    SharedRegion region;
    std::vector<TensorRef> refs;
    std::vector<double> scalars;
  };

  Prepared prepare(const nlohmann::json& request) {
    Prepared p;
    p.entry = entry_for(request.at("module"));
    RequestTensors t = open_tensors(request);
    p.refs = std::move(t.refs);
    p.region = std::move(t.region);
    p.scalars = request.at("scalars").get<std::vector<double>>();
    return p;
  }

  void launch(Entry entry, const kf_args& args) {
    const int status = entry(&args);
    if (status != KF_OK) {
      if (status == KF_ERR_OUT_OF_MEMORY) throw OutOfMemory("the kernel's own allocation failed");
      throw StatusError(fmt::format("kforge_run returned {} ({})", status,
                                    status == KF_ERR_UNSUPPORTED ? "UNSUPPORTED"
                                    : status == KF_ERR_LAUNCH    ? "LAUNCH failed"
                                                                 : "unknown status"));
    }
    backend_->check_launch();
  }

  nlohmann::json run(const nlohmann::json& request) {
    Prepared p = prepare(request);
    DeviceTensors tensors(*backend_, p.region, p.refs);
    const kf_args args = tensors.args(p.scalars, backend_->stream());
    const auto start = Clock::now();
    launch(p.entry, args);
    backend_->synchronize();
    nlohmann::json reply = {{"ok", true}};
    reply["seconds"] = std::chrono::duration<double>(Clock::now() - start).count();
    tensors.download(reply);
    return reply;
  }

  nlohmann::json bench(const nlohmann::json& request) {
    Prepared p = prepare(request);
    DeviceTensors tensors(*backend_, p.region, p.refs);
    const kf_args args = tensors.args(p.scalars, backend_->stream());
    nlohmann::json reply =
        sample(request.at("settings").get<BenchSettings>(), [&] { launch(p.entry, args); });
    tensors.download(reply);
    return reply;
  }

  // Times the library call PyTorch eager would make for this problem (cuBLAS).
  nlohmann::json baseline(const nlohmann::json& request) {
    if (backend_->info().backend != "cuda") throw Error("library baselines need the CUDA backend");
    const RequestTensors request_tensors = open_tensors(request);
    const auto& refs = request_tensors.refs;
    const SharedRegion& region = request_tensors.region;
    DeviceTensors tensors(*backend_, region, refs);
    const Sizes sizes = request.at("sizes").get<Sizes>();
    auto library =
        make_library_baseline(request.at("op_name").get<std::string>(), sizes, refs.front().dtype,
                              tensors.pointers(false), tensors.pointers(true),
                              static_cast<cudaStream_t>(backend_->stream()));
    nlohmann::json reply = sample(request.at("settings").get<BenchSettings>(), [&] {
      library->call();
      backend_->check_launch();
    });
    reply["baseline"] = library->describe();
    tensors.download(reply);
    return reply;
  }

  // fp32 GPU reference: inputs widened on the host, outputs written as f32 into the region.
  nlohmann::json reference(const nlohmann::json& request) {
    if (backend_->info().backend != "cuda") throw Error("GPU references need the CUDA backend");
    const RequestTensors request_tensors = open_tensors(request);
    const auto& refs = request_tensors.refs;
    const SharedRegion& region = request_tensors.region;
    std::vector<std::vector<float>> inputs, outputs;
    std::vector<const TensorRef*> output_refs;
    for (const auto& ref : refs) {
      const size_t n = ref.bytes / dtype_size(ref.dtype);
      if (ref.is_output) {
        if (ref.dtype != DType::f32) throw Error("GPU reference outputs are f32");
        outputs.emplace_back(n);
        output_refs.push_back(&ref);
      } else {
        std::vector<float> v(n);
        for (size_t i = 0; i < n; ++i) {
          v[i] = static_cast<float>(load_element(region.data() + ref.offset, ref.dtype, i));
        }
        inputs.push_back(std::move(v));
      }
    }
    compute_gpu_reference(request.at("op_name").get<std::string>(),
                          request.at("sizes").get<Sizes>(),
                          request.at("scalars").get<std::vector<double>>(), inputs, outputs,
                          static_cast<cudaStream_t>(backend_->stream()));
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::memcpy(region.data() + output_refs[i]->offset, outputs[i].data(),
                  outputs[i].size() * sizeof(float));
    }
    return {{"ok", true}};
  }

  // Warm-up, then cold-cache samples of `call` until the stopping rule says the median is known.
  nlohmann::json sample(const BenchSettings& settings, const std::function<void()>& call) {
    // Warm-up: module load, first-launch costs and clock ramp-up stay out of the samples.
    const auto warm_start = Clock::now();
    size_t warmup_runs = 0;
    while (warmup_runs < 3 || std::chrono::duration<double>(Clock::now() - warm_start).count() <
                                  settings.warmup_seconds) {
      backend_->time_once(call, settings.cold_cache);
      ++warmup_runs;
    }

    StoppingRule rule{settings.min_samples, settings.max_samples, settings.min_seconds,
                      settings.max_seconds, settings.target_rel_stderr};
    std::vector<double> kept;
    size_t throttled = 0;
    bool clock_monitored = false;
    std::vector<int> clocks;
    std::string reason;
    const auto start = Clock::now();
    for (;;) {
      const double ms = backend_->time_once(call, settings.cold_cache);
      const ClockReading clock = backend_->read_clock();
      clock_monitored = clock_monitored || clock.available;
      if (clock.available) clocks.push_back(clock.sm_clock_mhz);
      if (clock.throttled) {
        ++throttled;  // discarded: a throttled sample measures the cooling, not the kernel
      } else {
        kept.push_back(ms);
      }
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      if (rule.should_stop(kept, elapsed, &reason)) break;
      if (kept.empty() && elapsed > settings.max_seconds) {
        reason = "every sample was taken while throttled";
        break;
      }
    }
    nlohmann::json reply = {{"ok", true},
                            {"samples_ms", kept},
                            {"throttled_samples", throttled},
                            {"clock_monitored", clock_monitored},
                            {"warmup_runs", warmup_runs},
                            {"stop_reason", reason}};
    if (!clocks.empty()) {
      std::sort(clocks.begin(), clocks.end());
      reply["sm_clock_mhz_median"] = clocks[clocks.size() / 2];
    }
    return reply;
  }

  std::unique_ptr<DeviceBackend> backend_;
  std::map<std::string, std::unique_ptr<Module>> modules_;
};

void respond(const nlohmann::json& reply) {
  const std::string line = reply.dump() + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(kResponseFd, line.data() + done, line.size() - done);
    if (n <= 0) std::_Exit(4);  // kforge is gone
    done += static_cast<size_t>(n);
  }
}

nlohmann::json failure(const char* kind, const std::string& what) {
  return {{"ok", false}, {"kind", kind}, {"error", what}};
}

}  // namespace

int run_worker(const std::string& backend_name, int device) {
  std::unique_ptr<Worker> worker;
  try {
    worker = std::make_unique<Worker>(backend_name == "cuda" ? make_cuda_backend(device)
                                                             : make_cpu_backend());
  } catch (const std::exception& e) {
    respond(
        failure("error", fmt::format("cannot start the {} backend: {}", backend_name, e.what())));
    return 2;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    try {
      respond(worker->handle(nlohmann::json::parse(line)));
    } catch (const OutOfMemory& e) {
      respond(failure("oom", e.what()));
    } catch (const KernelFault& e) {
      // The device context is unusable after a fault: answer, then make way for a new worker.
      respond(failure("fault", e.what()));
      std::cout.flush();
      std::_Exit(3);
    } catch (const StatusError& e) {
      respond(failure("status", e.what()));
    } catch (const LoadError& e) {
      respond(failure("load", e.what()));
    } catch (const std::exception& e) {
      respond(failure("error", e.what()));
    }
  }
  return 0;
}

}  // namespace kforge
