// libkforge_inject.so: the CUDA driver loads it into every process that `kforge profile` runs
// (CUDA_INJECTION64_PATH) and calls InitializeInjection() from cuInit. It asks CUPTI for
// activity records (kernels, copies and fills, the runtime and driver calls that launched them,
// NVTX ranges), keeps them in memory and writes $KFORGE_PROFILE_DIR/raw-<pid>.json when the
// process ends (format: src/profile/cupti_import.h).
//
// The file is written at the last moment CUDA is still usable, whichever comes first:
//   - atexit (normal exit, and Python's exit after an uncaught exception),
//   - when a CUDA context is about to be destroyed (a runtime that tears down before our
//     atexit handler runs, cudaDeviceReset); later writes replace the file with more data,
//   - SIGTERM, SIGINT, SIGABRT when the program left them at their default action: best effort,
//     then the signal's default action runs.
// The library never throws into, and never exits, the host program; problems are printed on
// stderr prefixed "kforge-inject:" and recorded in the raw file.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>

#include <cuda.h>
#include <cupti.h>

#include "profile/inject/activity_store.h"

namespace kforge::inject {
namespace {

// CUPTI fills buffers of this size; it asks for a new one as each fills, so nothing is dropped
// while memory lasts.
constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr size_t kRecordAlignment = 8;
// A flush in a signal handler can block on a lock the interrupted code holds; after this long
// SIGALRM's default action ends the process instead of leaving it hanging.
constexpr unsigned kSignalFlushSeconds = 10;

ActivityStore& store() {
  // Never destroyed: CUPTI's worker thread may still deliver a buffer while static objects are
  // being torn down at exit.
  static auto* instance = new ActivityStore;
  return *instance;
}

void note_error(const std::string& message) {
  std::fprintf(stderr, "kforge-inject: %s\n", message.c_str());
  store().add_error(message);
}

bool cupti_succeeded(CUptiResult result, const char* call, const char* file, int line) {
  if (result == CUPTI_SUCCESS) return true;
  const char* name = nullptr;
  if (cuptiGetResultString(result, &name) != CUPTI_SUCCESS || !name) name = "unknown CUPTI error";
  note_error(std::string(call) + " failed: " + name + " (" + file + ":" + std::to_string(line) +
             ")");
  return false;
}

// Checks one CUPTI call: on failure it reports the call and CUPTI's error name and evaluates to
// false; it never throws or exits.
#define KF_CUPTI_CHECK(call) ::kforge::inject::cupti_succeeded((call), #call, __FILE__, __LINE__)

struct State {
  pid_t pid = 0;  // the process that initialized; a fork()ed child must not write its copy
  std::string directory;
  CUpti_SubscriberHandle subscriber = nullptr;
  bool recording = false;   // CUPTI delivers records; else only the errors are written
  bool subscribed = false;  // live_contexts is counted
  std::atomic<int> live_contexts{0};
  std::atomic<bool> written{false};
  OwnedMutex write_mutex;
};

State& state() {
  static auto* instance = new State;
  return *instance;
}

void CUPTIAPI on_buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kRecordAlignment, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
  if (!*buffer) note_error("out of memory for a CUPTI activity buffer; records will be dropped");
}

void CUPTIAPI on_buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer,
                                  size_t /*size*/, size_t valid_size) {
  try {
    if (buffer && valid_size > 0) store().add_buffer(buffer, valid_size);
    size_t dropped = 0;
    if (KF_CUPTI_CHECK(cuptiActivityGetNumDroppedRecords(context, stream, &dropped))) {
      store().add_dropped(dropped);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kforge-inject: reading an activity buffer: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "kforge-inject: reading an activity buffer failed\n");
  }
  std::free(buffer);
}

// CUPTI's name of an API call ("cudaLaunchKernel_v7000"), for the raw file's call counts.
std::string api_name(bool runtime, uint32_t cbid) {
  const char* name = nullptr;
  const CUpti_CallbackDomain domain =
      runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API;
  if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || !name) return "";
  return name;
}

// Writes the raw file atomically: a reader never sees half of it.
void write_raw_file(const std::string& text) {
  const State& s = state();
  const std::string path = s.directory + "/raw-" + std::to_string(s.pid) + ".json";
  const std::string temporary = path + ".tmp";
  FILE* out = std::fopen(temporary.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "kforge-inject: cannot write %s: %s\n", temporary.c_str(),
                 std::strerror(errno));
    return;
  }
  const bool complete = std::fwrite(text.data(), 1, text.size(), out) == text.size();
  const bool closed = std::fclose(out) == 0;
  if (!complete || !closed || std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "kforge-inject: cannot write %s: %s\n", path.c_str(),
                 std::strerror(errno));
    std::remove(temporary.c_str());
  }
}

// Whether a context may be alive to deliver records from. Unknown without the subscription:
// then assume so.
bool contexts_may_be_alive() {
  return !state().subscribed || state().live_contexts.load() > 0;
}

// Delivers every buffer CUPTI still holds (when a context is alive to deliver from) and writes
// the raw file if anything is new since the last write.
void flush_and_write(const std::string& written_at, bool flush) {
  State& s = state();
  if (::getpid() != s.pid) return;
  std::lock_guard lock(s.write_mutex);
  if (s.recording) {
    if (flush) KF_CUPTI_CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    size_t dropped = 0;
    if (KF_CUPTI_CHECK(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped))) {
      store().add_dropped(dropped);
    }
  }
  if (s.written.load() && !store().has_new_rows()) return;
  write_raw_file(store().to_json(s.pid, written_at, api_name));
  s.written.store(true);
}

void on_exit() {
  try {
    // After the runtime destroyed its contexts there is nothing left to flush, and a flush
    // could wait on a context that is going away.
    flush_and_write("exit", contexts_may_be_alive());
  } catch (...) {
    std::fprintf(stderr, "kforge-inject: writing the profile at exit failed\n");
  }
}

void on_fatal_signal(int signal_number) {
  static std::atomic<bool> entered{false};
  State& s = state();
  // A signal that interrupted this thread while it held one of the locks cannot flush (the
  // data would be half-updated, or the lock never released); the last write stands then.
  if (!entered.exchange(true) && !store().held_by_this_thread() &&
      !s.write_mutex.held_by_this_thread()) {
    ::alarm(kSignalFlushSeconds);
    try {
      flush_and_write("signal " + std::to_string(signal_number), contexts_may_be_alive());
    } catch (...) {
    }
    ::alarm(0);
  }
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

// Only signals the program leaves at their default action: a program that handles SIGINT
// itself (Python raises KeyboardInterrupt) ends through its normal exit path instead.
void install_signal_handlers() {
  for (const int signal_number : {SIGTERM, SIGINT, SIGABRT}) {
    struct sigaction current {};
    if (sigaction(signal_number, nullptr, &current) != 0) continue;
    if ((current.sa_flags & SA_SIGINFO) || current.sa_handler != SIG_DFL) continue;
    struct sigaction handler {};
    handler.sa_handler = on_fatal_signal;
    sigemptyset(&handler.sa_mask);
    handler.sa_flags = SA_RESTART;
    sigaction(signal_number, &handler, nullptr);
  }
}

// Name, compute capability and SM count of a context's device, from the driver that loaded
// this library (looked up at run time, so the library links against CUPTI alone).
void record_device(CUcontext context) {
  uint32_t id = 0;
  if (!KF_CUPTI_CHECK(cuptiGetDeviceId(context, &id))) return;
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!driver) {
    note_error("libcuda.so.1 is not loaded; device properties are not recorded");
    return;
  }
  using DeviceGetFn = CUresult (*)(CUdevice*, int);
  using NameFn = CUresult (*)(char*, int, CUdevice);
  using AttributeFn = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  const auto device_get = reinterpret_cast<DeviceGetFn>(dlsym(driver, "cuDeviceGet"));
  const auto get_name = reinterpret_cast<NameFn>(dlsym(driver, "cuDeviceGetName"));
  const auto get_attribute = reinterpret_cast<AttributeFn>(dlsym(driver, "cuDeviceGetAttribute"));
  DeviceRow row;
  row.id = id;
  CUdevice device = 0;
  char name[256] = {};
  if (!device_get || !get_name || !get_attribute ||
      device_get(&device, static_cast<int>(id)) != CUDA_SUCCESS ||
      get_name(name, sizeof name, device) != CUDA_SUCCESS ||
      get_attribute(&row.compute_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device) !=
          CUDA_SUCCESS ||
      get_attribute(&row.compute_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device) !=
          CUDA_SUCCESS ||
      get_attribute(&row.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device) !=
          CUDA_SUCCESS) {
    note_error("querying device " + std::to_string(id) + " through the driver failed");
  }
  row.name = name;
  store().add_device(row);
  dlclose(driver);
}

void CUPTIAPI on_callback(void* /*userdata*/, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                          const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RESOURCE) return;
  try {
    const auto* resource = static_cast<const CUpti_ResourceData*>(data);
    if (cbid == CUPTI_CBID_RESOURCE_CONTEXT_CREATED) {
      state().live_contexts.fetch_add(1);
      record_device(resource->context);
    } else if (cbid == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) {
      // The context still works here; once it is gone its records may be too.
      flush_and_write("context-destroy", true);
      state().live_contexts.fetch_sub(1);
    }
  } catch (...) {
    std::fprintf(stderr, "kforge-inject: a resource callback failed\n");
  }
}

// Where the CUPTI this library uses lives, or "" when unknown.
std::string cupti_library_file() {
  Dl_info info{};
  const auto symbol = reinterpret_cast<void*>(&cuptiActivityEnable);
  if (dladdr(symbol, &info) == 0 || !info.dli_fname) return "";
  return info.dli_fname;
}

// Where this library itself lives.
std::string own_library_file() {
  Dl_info info{};
  const auto symbol = reinterpret_cast<void*>(&own_library_file);
  if (dladdr(symbol, &info) == 0 || !info.dli_fname) return "";
  return info.dli_fname;
}

bool same_file(const char* a, const std::string& b) {
  struct stat a_file {};
  struct stat b_file {};
  if (b.empty() || stat(a, &a_file) != 0 || stat(b.c_str(), &b_file) != 0) return false;
  return a_file.st_dev == b_file.st_dev && a_file.st_ino == b_file.st_ino;
}

// NVTX ranges reach CUPTI only through the library named by NVTX_INJECTION64_PATH: this one
// (which hands them to the CUPTI it is bound to, see InitializeInjectionNvtx2) or that CUPTI.
// Another copy of CUPTI would get ranges and record nothing.
void check_nvtx_injection() {
  const char* nvtx = std::getenv("NVTX_INJECTION64_PATH");
  if (!nvtx || !*nvtx) {
    note_error("NVTX_INJECTION64_PATH is not set: NVTX ranges will not be recorded");
    return;
  }
  const std::string ours = cupti_library_file();
  if (ours.empty() || same_file(nvtx, own_library_file()) || same_file(nvtx, ours)) return;
  {
    note_error(std::string("NVTX_INJECTION64_PATH is ") + nvtx +
               " but activity records come from " + ours + "; NVTX ranges may be missing");
  }
}

// Calls that only read or set state (cudaGetDevice, cudaGetLastError, cuCtxGetCurrent, ...)
// launch no GPU work, so no kernel needs their record, yet a framework makes several of them per
// kernel and each record costs the profiled program time. Their prefixes, as CUPTI names them:
constexpr std::string_view kQueryApiPrefixes[] = {
    // runtime
    "cudaGetDevice", "cudaSetDevice", "cudaGetLastError", "cudaPeekAtLastError",
    "cudaDeviceGetAttribute", "cudaDeviceGetStreamPriorityRange", "cudaPointerGetAttributes",
    "cudaStreamIsCapturing", "cudaStreamGetCaptureInfo", "cudaThreadExchangeStreamCaptureMode",
    "cudaFuncGetAttributes", "cudaEventQuery", "cudaStreamQuery", "cudaDriverGetVersion",
    "cudaRuntimeGetVersion", "cudaGetDriverEntryPoint", "cudaGetFuncBySymbol", "cudaOccupancy",
    "cudaGetErrorString", "cudaGetErrorName",
    // driver
    "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxGetDevice", "cuCtxPushCurrent", "cuCtxPopCurrent",
    "cuCtxGetStreamPriorityRange", "cuDeviceGet", "cuDevicePrimaryCtxGetState", "cuGetProcAddress",
    "cuPointerGetAttribute", "cuStreamIsCapturing", "cuStreamGetCaptureInfo", "cuFuncGetAttribute",
    "cuKernelGetAttribute", "cuKernelGetFunction", "cuLibraryGetKernel", "cuModuleGetFunction",
    "cuOccupancy", "cuStreamQuery", "cuEventQuery", "cuDriverGetVersion", "cuGetErrorString",
    "cuGetErrorName", "cuThreadExchangeStreamCaptureMode", "cuKernelGetName", "cuFuncGetName",
    "cuCtxGetLimit", "cuKernelSetAttribute", "cuFuncSetAttribute"};

bool is_query_api(std::string_view name) {
  for (const std::string_view prefix : kQueryApiPrefixes) {
    if (name.starts_with(prefix)) return true;
  }
  return false;
}

// Leaves the query calls out of the API records (after CUPTI_ACTIVITY_KIND_RUNTIME and _DRIVER
// were enabled: enabling a kind resets these settings). CUPTI before 12.x has no per-call switch
// and records every call; so does KFORGE_PROFILE_ALL_APIS=1.
void skip_query_apis() {
  if (const char* all = std::getenv("KFORGE_PROFILE_ALL_APIS"); all && *all && *all != '0') return;
  using EnableFn = CUptiResult (*)(CUpti_CallbackId, uint8_t);
  void* cupti = dlopen(cupti_library_file().c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!cupti) return;
  struct Domain {
    CUpti_CallbackDomain domain;
    const char* switch_name;
    CUpti_CallbackId size;
  };
  for (const Domain& d : {Domain{CUPTI_CB_DOMAIN_RUNTIME_API, "cuptiActivityEnableRuntimeApi",
                                 CUPTI_RUNTIME_TRACE_CBID_SIZE},
                          Domain{CUPTI_CB_DOMAIN_DRIVER_API, "cuptiActivityEnableDriverApi",
                                 CUPTI_DRIVER_TRACE_CBID_SIZE}}) {
    const auto enable = reinterpret_cast<EnableFn>(dlsym(cupti, d.switch_name));
    if (!enable) continue;
    for (CUpti_CallbackId cbid = 1; cbid < d.size; ++cbid) {
      const char* name = nullptr;
      if (cuptiGetCallbackName(d.domain, cbid, &name) != CUPTI_SUCCESS || !name ||
          !is_query_api(name))
        continue;
      if (!KF_CUPTI_CHECK(enable(cbid, 0))) break;  // refused once, refused for all: say it once
    }
  }
  dlclose(cupti);  // drops the reference RTLD_NOLOAD took; the library stays loaded
}

bool initialize() {
  State& s = state();
  s.pid = ::getpid();
  const char* directory = std::getenv("KFORGE_PROFILE_DIR");
  s.directory = directory && *directory ? directory : ".";
  // Registered first, so that a failed start still leaves a file saying why.
  std::atexit(on_exit);

  uint32_t version = 0;
  if (KF_CUPTI_CHECK(cuptiGetVersion(&version)) && version != CUPTI_API_VERSION) {
    note_error("CUPTI API version " + std::to_string(version) + " differs from the " +
               std::to_string(CUPTI_API_VERSION) +
               " this library was built for; records may be misread");
  }
  // Thread ids as the kernel numbers them (gettid), the same for API calls and NVTX ranges.
  KF_CUPTI_CHECK(cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM));
  if (!KF_CUPTI_CHECK(cuptiActivityRegisterCallbacks(on_buffer_requested, on_buffer_completed))) {
    return false;
  }
  // Fails where the program subscribed to CUPTI itself; then only the exit paths write.
  s.subscribed = KF_CUPTI_CHECK(cuptiSubscribe(&s.subscriber, on_callback, nullptr)) &&
                 KF_CUPTI_CHECK(cuptiEnableDomain(1, s.subscriber, CUPTI_CB_DOMAIN_RESOURCE));
  // Kernels are what a profile is for; without them there is nothing to record.
  if (!KF_CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL))) return false;
  s.recording = true;
  KF_CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
  KF_CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY2));
  KF_CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
  KF_CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
  KF_CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER));
  skip_query_apis();
  KF_CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MARKER));
  check_nvtx_injection();
  install_signal_handlers();
  return true;
}

}  // namespace
}  // namespace kforge::inject

// Called by the CUDA driver (once per process) when CUDA_INJECTION64_PATH names this library.
// Nonzero means the injection initialized.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static std::atomic<bool> initialized{false};
  if (initialized.exchange(true)) return 1;
  try {
    return kforge::inject::initialize() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kforge-inject: initialization failed: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "kforge-inject: initialization failed\n");
  }
  return 0;
}

// NVTX calls this in the library NVTX_INJECTION64_PATH names, once, at the first NVTX call.
// `kforge profile` names this library, which hands the call on to the CUPTI it is bound to: a
// process may have loaded its own copy of libcupti before CUDA loaded this library (PyTorch
// wheels ship one), and then that copy records the activity and must also get the ranges.
extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    const void* get_export_table) {
  const std::string cupti = kforge::inject::cupti_library_file();
  void* handle = cupti.empty() ? nullptr : dlopen(cupti.c_str(), RTLD_NOW | RTLD_NOLOAD);
  using InitializeFn = int (*)(const void*);
  const auto initialize =
      handle ? reinterpret_cast<InitializeFn>(dlsym(handle, "InitializeInjectionNvtx2")) : nullptr;
  if (!initialize) {
    std::fprintf(stderr,
                 "kforge-inject: %s has no InitializeInjectionNvtx2; NVTX ranges will not be "
                 "recorded\n",
                 cupti.empty() ? "the CUPTI library" : cupti.c_str());
    return 0;
  }
  return initialize(get_export_table);
}
