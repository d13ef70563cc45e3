// The worker: loads kernel modules and runs them on one device, on kforge's behalf. Anything a
// candidate does wrong (crash, hang, illegal access, running out of memory, breaking a rule of
// the measurement) happens here, and kforge sees it as a verdict. Before any candidate code is
// loaded, the worker fences itself in (run/sandbox.h).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "core/error.h"
#include "core/process.h"
#include "device/backend.h"
#include "device/cublas_ops.h"
#include "kforge/kernel.h"
#include "run/device_tensors.h"
#include "run/protocol.h"
#include "run/sandbox.h"
#include "run/shared_region.h"
#include "run/timed_samples.h"

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

void to_json(nlohmann::json& j, const FreshInput& f) {
  j = {{"kind", static_cast<int>(f.kind)},
       {"scale", f.scale},
       {"bound", f.bound},
       {"special", f.special},
       {"special_share", f.special_share},
       {"row_length", f.row_length}};
}

void from_json(const nlohmann::json& j, FreshInput& f) {
  f.kind = static_cast<FreshInput::Kind>(j.at("kind").get<int>());
  j.at("scale").get_to(f.scale);
  j.at("bound").get_to(f.bound);
  j.at("special").get_to(f.special);
  j.at("special_share").get_to(f.special_share);
  j.at("row_length").get_to(f.row_length);
}

namespace {

using Entry = int (*)(const kf_args*);
using Clock = std::chrono::steady_clock;

// Whatever a candidate prints lands in the worker's log; past this size, writes fail.
constexpr long long kMaxLogBytes = 256ll << 20;

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

class Worker {
 public:
  explicit Worker(std::unique_ptr<DeviceBackend> backend) : backend_(std::move(backend)) {}

  nlohmann::json handle(const nlohmann::json& request) {
    const std::string op = request.at("op");
    // A session lives until the next request that is not about it.
    if (op != "replay") session_.reset();
    if (op == "hello") {
      return {{"ok", true},
              {"device", backend_->info()},
              {"pid", getpid()},
              {"threads", count_own_threads()}};
    }
    if (op == "ceilings") return {{"ok", true}, {"ceilings", backend_->measure_ceilings()}};
    if (op == "run") return run(request);
    if (op == "measure") return measure(request);
    if (op == "replay") return replay(request);
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

  // One checked run: the call once as it is (lazy initialization), then made repeatable (on
  // CUDA, captured: work outside the given stream is refused) and run from poisoned outputs.
  nlohmann::json run(const nlohmann::json& request) {
    const Entry entry = entry_for(request.at("module"));
    RequestTensors t = open_tensors(request);
    DeviceTensors tensors(*backend_, t.region, t.refs);
    const auto scalars = request.at("scalars").get<std::vector<double>>();
    const kf_args args = tensors.args(scalars, backend_->stream());
    const auto call = [&] { launch(entry, args); };
    const auto start = Clock::now();
    const std::vector<DeviceSpan> outputs = tensors.spans(true);
    const auto repeatable = make_steady_repeatable(*backend_, call, outputs);
    for (const auto& o : outputs)
      backend_->poison(o);
    repeatable->launch();
    backend_->check_launch();
    backend_->synchronize();
    backend_->check_nothing_left_running(std::chrono::seconds(2));
    nlohmann::json reply = {{"ok", true}, {"threads", count_own_threads()}};
    reply["seconds"] = std::chrono::duration<double>(Clock::now() - start).count();
    reply["guard_violations"] = tensors.guard_violations();
    reply["inputs_modified"] = tensors.inputs_modified();
    tensors.download(true);
    return reply;
  }

  // A timed session over a module (a candidate or a library kernel) or a library call (cuBLAS).
  nlohmann::json measure(const nlohmann::json& request) {
    library_.reset();
    measured_region_ = std::make_unique<RequestTensors>(open_tensors(request));
    auto tensors = std::make_unique<DeviceTensors>(*backend_, measured_region_->region,
                                                   measured_region_->refs);
    const auto scalars = request.at("scalars").get<std::vector<double>>();
    std::function<void()> call;
    if (const std::string library = request.value("library", ""); !library.empty()) {
      if (backend_->info().backend != "cuda")
        throw Error("library baselines need the CUDA backend");
      library_ = make_library_baseline(library, request.at("sizes").get<Sizes>(),
                                       measured_region_->refs.front().dtype,
                                       tensors->pointers(false), tensors->pointers(true),
                                       static_cast<cudaStream_t>(backend_->stream()));
      call = [this] {
        library_->call();
        backend_->check_launch();
      };
    } else {
      const Entry entry = entry_for(request.at("module"));
      measured_args_ = tensors->args(scalars, backend_->stream());
      call = [this, entry] { launch(entry, measured_args_); };
    }
    session_ = std::make_unique<TimedSession>(*backend_, std::move(tensors), call,
                                              request.at("fresh").get<std::vector<FreshInput>>());
    ProbePlan probes;
    probes.repeats = request.value("repeats", probes.repeats);
    probes.traps = request.value("traps", probes.traps);
    nlohmann::json reply = session_->measure(request.at("settings").get<BenchSettings>(),
                                             request.at("seed").get<uint64_t>(), probes);
    if (!library_)
      reply["threads"] = count_own_threads();
    else
      reply["baseline"] = library_->describe();
    return reply;
  }

  nlohmann::json replay(const nlohmann::json& request) {
    if (!session_) throw Error("replay: no measurement to replay (it ends with the next request)");
    return session_->replay(request.at("index").get<size_t>());
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

  std::unique_ptr<DeviceBackend> backend_;
  std::map<std::string, std::unique_ptr<Module>> modules_;
  // The current measurement, kept for replays. Destroyed in reverse order: session (it owns
  // the device tensors), library call, args, region.
  std::unique_ptr<RequestTensors> measured_region_;
  kf_args measured_args_{};
  std::unique_ptr<LibraryBaseline> library_;
  std::unique_ptr<TimedSession> session_;
};

// Replies go out on the channel's OUT descriptor, whole lines only.
class Replies {
 public:
  explicit Replies(int fd) : fd_(fd) {}
  void send(nlohmann::json reply, uint64_t seq) {
    reply["seq"] = seq;
    const std::string line = reply.dump() + "\n";
    size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
      if (n <= 0) std::_Exit(4);  // kforge is gone
      done += static_cast<size_t>(n);
    }
  }

 private:
  int fd_;
};

// Reads request lines from the channel's IN descriptor.
class Requests {
 public:
  explicit Requests(int fd) : fd_(fd) {}
  bool next(std::string& line) {
    for (;;) {
      if (const auto nl = buffer_.find('\n'); nl != std::string::npos) {
        line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return true;
      }
      char chunk[65536];
      const ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

 private:
  int fd_;
  std::string buffer_;
};

nlohmann::json failure(const char* kind, const std::string& what) {
  return {{"ok", false}, {"kind", kind}, {"error", what}};
}

}  // namespace

int run_worker(const WorkerFlags& flags) {
  const auto channel = parse_channel(flags.channel);
  if (!channel) {
    fmt::print(stderr, "kforge __worker: --channel IN,OUT is required\n");
    return 2;
  }
  limit_worker_process(static_cast<pid_t>(flags.parent), kMaxLogBytes);
  if (flags.cpu_core >= 0) pin_to_core(flags.cpu_core);
  // Load every kernel of a module when the module is loaded, not at its first launch: loading
  // a kernel while a candidate's own kernel still runs can wait for that kernel forever, and
  // the wait would hide what the candidate left running.
  ::setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  Replies replies(channel->out);
  Requests requests(channel->in);
  std::string line;
  std::unique_ptr<Worker> worker;
  while (requests.next(line)) {
    if (line.empty()) continue;
    const nlohmann::json request = nlohmann::json::parse(line, nullptr, false);
    const uint64_t seq = request.is_object() ? request.value("seq", uint64_t{0}) : 0;
    if (!worker) {
      // The backend starts on the first request (hello), then the fence goes up, before any
      // candidate code can be loaded.
      try {
        worker = std::make_unique<Worker>(flags.backend == "cuda" ? make_cuda_backend(flags.device)
                                                                  : make_cpu_backend());
      } catch (const std::exception& e) {
        replies.send(failure("error", fmt::format("cannot start the {} backend: {}", flags.backend,
                                                  e.what())),
                     seq);
        return 2;
      }
      if (const std::string why = forbid_new_processes(); !why.empty()) {
        fmt::print(stderr, "kforge worker: no seccomp filter ({}); process groups only\n", why);
      }
    }
    nlohmann::json reply;
    bool exit_after = false;  // the device context, or what the candidate left, is unusable
    try {
      reply = worker->handle(request);
    } catch (const OutOfMemory& e) {
      reply = failure("oom", e.what());
    } catch (const KernelFault& e) {
      reply = failure("fault", e.what());
      exit_after = true;
    } catch (const IntegrityViolation& e) {
      reply = failure(e.fatal() ? "fatal" : "invalid", e.what());
      exit_after = e.fatal();
    } catch (const StatusError& e) {
      reply = failure("status", e.what());
    } catch (const LoadError& e) {
      reply = failure("load", e.what());
    } catch (const std::exception& e) {
      reply = failure("error", e.what());
    }
    // Hostile even when it failed: a candidate that tried to leave the fence is not timed.
    if (const auto attempt = forbidden_attempt()) {
      reply = failure(exit_after ? "fatal" : "invalid",
                      fmt::format("the kernel tried to {}, which kernel files may not do (the "
                                  "attempt failed)",
                                  *attempt));
    }
    replies.send(reply, seq);
    if (exit_after) std::_Exit(3);
  }
  return 0;
}

}  // namespace kforge
