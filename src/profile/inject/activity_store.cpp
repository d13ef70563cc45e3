#include "profile/inject/activity_store.h"

#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <string_view>
#include <unordered_set>
#include <utility>

namespace kforge::inject {
namespace {

pid_t this_thread() {
  return static_cast<pid_t>(::syscall(SYS_gettid));
}

// Length of the valid UTF-8 sequence starting at s[i], or 0 when the bytes there are not one.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  size_t length = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
  } else {
    return 0;
  }
  if (i + length > s.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  }
  return length;
}

// A JSON string literal. NVTX texts come from the program and may hold any bytes; bytes that
// are not UTF-8 become '?' so that the file always parses.
void append_string(std::string& out, std::string_view s) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (const size_t length = utf8_sequence_length(s, i); length > 0) {
      out.append(s.substr(i, length));
      i += length - 1;
    } else {
      out += '?';
    }
  }
  out += '"';
}

void append_key(std::string& out, const char* key) {
  out += '"';
  out += key;
  out += "\":";
}

void append_uint(std::string& out, uint64_t value) {
  out += std::to_string(value);
}

void append_int(std::string& out, int64_t value) {
  out += std::to_string(value);
}

template <typename T>
void append_triple(std::string& out, const T (&values)[3]) {
  out += '[';
  for (int i = 0; i < 3; ++i) {
    if (i) out += ',';
    out += std::to_string(values[i]);
  }
  out += ']';
}

// One JSON object's fields, written in order with the commas between them; the braces come
// from construction and destruction.
class ObjectWriter {
 public:
  explicit ObjectWriter(std::string& out) : out_(out) { out_ += '{'; }
  ~ObjectWriter() { out_ += '}'; }
  ObjectWriter(const ObjectWriter&) = delete;
  ObjectWriter& operator=(const ObjectWriter&) = delete;

  ObjectWriter& uint(const char* key, uint64_t value) {
    append_uint(next(key), value);
    return *this;
  }
  ObjectWriter& integer(const char* key, int64_t value) {
    append_int(next(key), value);
    return *this;
  }
  ObjectWriter& string(const char* key, std::string_view value) {
    append_string(next(key), value);
    return *this;
  }
  template <typename T>
  ObjectWriter& triple(const char* key, const T (&values)[3]) {
    append_triple(next(key), values);
    return *this;
  }
  // A field whose value is already JSON text.
  ObjectWriter& raw(const char* key, std::string_view json) {
    next(key) += json;
    return *this;
  }

 private:
  std::string& next(const char* key) {
    if (any_) out_ += ',';
    any_ = true;
    append_key(out_, key);
    return out_;
  }
  std::string& out_;
  bool any_ = false;
};

const char* memcpy_kind_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA:
      return "HtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH:
      return "AtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
      return "AtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
      return "AtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA:
      return "DtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "PtoP";
    default:
      return "unknown";
  }
}

}  // namespace

void OwnedMutex::lock() {
  mutex_.lock();
  owner_.store(this_thread());
}

void OwnedMutex::unlock() {
  owner_.store(0);
  mutex_.unlock();
}

bool OwnedMutex::held_by_this_thread() const {
  return owner_.load() == this_thread();
}

void ActivityStore::add_buffer(const uint8_t* buffer, size_t valid_size) {
  std::lock_guard lock(mutex_);
  CUpti_Activity* record = nullptr;
  for (;;) {
    const CUptiResult status =
        cuptiActivityGetNextRecord(const_cast<uint8_t*>(buffer), valid_size, &record);
    if (status == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
    if (status != CUPTI_SUCCESS) {
      // The rest of this buffer cannot be read; say so rather than lose it silently.
      const char* name = nullptr;
      if (cuptiGetResultString(status, &name) != CUPTI_SUCCESS || !name) name = "unknown error";
      add_error(std::string("cuptiActivityGetNextRecord failed: ") + name +
                "; the rest of an activity buffer was lost");
      break;
    }
    add_record(record);
  }
  new_rows_.store(true);
}

void ActivityStore::add_record(const CUpti_Activity* record) {
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      KernelRow row;
      row.name = kernel_name_index(k->name);
      row.grid[0] = k->gridX;
      row.grid[1] = k->gridY;
      row.grid[2] = k->gridZ;
      row.block[0] = k->blockX;
      row.block[1] = k->blockY;
      row.block[2] = k->blockZ;
      row.cluster[0] = k->clusterX;
      row.cluster[1] = k->clusterY;
      row.cluster[2] = k->clusterZ;
      row.registers = k->registersPerThread;
      row.static_smem = k->staticSharedMemory;
      row.dynamic_smem = k->dynamicSharedMemory;
      row.start = k->start;
      row.end = k->end;
      row.device = k->deviceId;
      row.stream = k->streamId;
      row.correlation = k->correlationId;
      kernels_.push_back(row);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      transfers_.push_back({memcpy_kind_name(m->copyKind), m->bytes, m->start, m->end, m->deviceId,
                            m->streamId, m->correlationId});
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY2: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(record);
      transfers_.push_back(
          {"PtoP", m->bytes, m->start, m->end, m->deviceId, m->streamId, m->correlationId});
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      transfers_.push_back(
          {"memset", m->bytes, m->start, m->end, m->deviceId, m->streamId, m->correlationId});
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      const bool runtime = record->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
      api_calls_.push_back({runtime, a->cbid, a->correlationId, a->threadId, a->start, a->end});
      ++api_counts_[(runtime ? 0 : uint64_t{1} << 32) | a->cbid];
      break;
    }
    case CUPTI_ACTIVITY_KIND_MARKER: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMarker2*>(record);
      MarkerRow row;
      row.id = m->id;
      if (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_START) {
        row.kind = "start";
      } else if (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_END) {
        row.kind = "end";
      } else {
        row.kind = "instant";
      }
      row.time = m->timestamp;
      // Markers of a thread name the process and thread; others (stream or device markers)
      // carry no thread, and are kept with thread 0.
      if (m->objectKind == CUPTI_ACTIVITY_OBJECT_THREAD ||
          m->objectKind == CUPTI_ACTIVITY_OBJECT_PROCESS) {
        row.thread = m->objectId.pt.threadId;
      }
      if (m->name) row.name = m->name;
      if (m->domain) row.domain = m->domain;
      markers_.push_back(std::move(row));
      break;
    }
    default:
      ++unknown_records_;
      break;
  }
}

uint32_t ActivityStore::kernel_name_index(const char* name) {
  const std::string key = name ? name : "<unnamed kernel>";
  const auto [it, inserted] =
      kernel_name_ids_.try_emplace(key, static_cast<uint32_t>(kernel_names_.size()));
  if (inserted) kernel_names_.push_back(key);
  return it->second;
}

void ActivityStore::add_dropped(size_t count) {
  std::lock_guard lock(mutex_);
  dropped_ += count;
  if (count) new_rows_.store(true);
}

void ActivityStore::add_device(const DeviceRow& device) {
  std::lock_guard lock(mutex_);
  for (const auto& d : devices_) {
    if (d.id == device.id) return;
  }
  devices_.push_back(device);
  new_rows_.store(true);
}

void ActivityStore::add_error(const std::string& message) {
  std::lock_guard lock(errors_mutex_);
  // A failing call in a loop must not fill memory with copies of one message.
  constexpr size_t kMaxErrors = 100;
  if (errors_.size() < kMaxErrors) errors_.push_back(message);
  new_rows_.store(true);
}

std::string ActivityStore::to_json(pid_t pid, const std::string& written_at, ApiNamer namer) {
  std::lock_guard lock(mutex_);
  new_rows_.store(false);
  std::string out;
  out.reserve(256 + kernels_.size() * 220 + api_calls_.size() * 110 + markers_.size() * 120);
  out += "{\"format\":\"kforge-cupti-raw\",\"version\":1,";
  append_key(out, "pid");
  append_int(out, pid);
  out += ',';
  append_key(out, "written_at");
  append_string(out, written_at);
  out += ',';
  append_key(out, "dropped_records");
  append_uint(out, dropped_);
  out += ',';
  append_key(out, "unknown_records");
  append_uint(out, unknown_records_);
  out += ',';
  append_key(out, "errors");
  out += '[';
  {
    std::lock_guard errors_lock(errors_mutex_);
    for (size_t i = 0; i < errors_.size(); ++i) {
      if (i) out += ',';
      append_string(out, errors_[i]);
    }
  }
  out += "],\n";

  append_key(out, "devices");
  out += '[';
  for (size_t i = 0; i < devices_.size(); ++i) {
    const DeviceRow& d = devices_[i];
    out += i ? ",\n" : "\n";
    ObjectWriter(out)
        .uint("id", d.id)
        .string("name", d.name)
        .raw("compute_capability",
             '[' + std::to_string(d.compute_major) + ',' + std::to_string(d.compute_minor) + ']')
        .integer("sm_count", d.sm_count);
  }
  out += "],\n";

  append_key(out, "kernel_names");
  out += '[';
  for (size_t i = 0; i < kernel_names_.size(); ++i) {
    out += i ? ",\n" : "\n";
    append_string(out, kernel_names_[i]);
  }
  out += "],\n";

  std::unordered_set<uint32_t> launched;  // correlation ids of work the GPU did
  append_key(out, "kernels");
  out += '[';
  for (size_t i = 0; i < kernels_.size(); ++i) {
    const KernelRow& k = kernels_[i];
    launched.insert(k.correlation);
    out += i ? ",\n" : "\n";
    ObjectWriter(out)
        .uint("name", k.name)
        .triple("grid", k.grid)
        .triple("block", k.block)
        .triple("cluster", k.cluster)
        .uint("registers", k.registers)
        .integer("static_smem", k.static_smem)
        .integer("dynamic_smem", k.dynamic_smem)
        .uint("start", k.start)
        .uint("end", k.end)
        .uint("device", k.device)
        .uint("stream", k.stream)
        .uint("correlation", k.correlation);
  }
  out += "],\n";

  append_key(out, "transfers");
  out += '[';
  for (size_t i = 0; i < transfers_.size(); ++i) {
    const TransferRow& t = transfers_[i];
    launched.insert(t.correlation);
    out += i ? ",\n" : "\n";
    ObjectWriter(out)
        .string("kind", t.kind)
        .uint("bytes", t.bytes)
        .uint("start", t.start)
        .uint("end", t.end)
        .uint("device", t.device)
        .uint("stream", t.stream)
        .uint("correlation", t.correlation);
  }
  out += "],\n";

  // Every CUDA call made a record; only the ones that launched GPU work matter here.
  append_key(out, "api_calls");
  out += '[';
  bool first = true;
  for (const ApiRow& a : api_calls_) {
    if (!launched.count(a.correlation)) continue;
    out += first ? "\n" : ",\n";
    first = false;
    ObjectWriter(out)
        .string("api", a.runtime ? "runtime" : "driver")
        .uint("cbid", a.cbid)
        .uint("correlation", a.correlation)
        .uint("thread", a.thread)
        .uint("start", a.start)
        .uint("end", a.end);
  }
  out += "],\n";

  // What the profiled program spent its API calls on: the profiler's cost grows with them.
  std::vector<std::pair<uint64_t, uint64_t>> counts(api_counts_.begin(), api_counts_.end());
  std::sort(counts.begin(), counts.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  append_key(out, "api_counts");
  out += '[';
  for (size_t i = 0; i < counts.size(); ++i) {
    const bool runtime = (counts[i].first >> 32) == 0;
    const auto cbid = static_cast<uint32_t>(counts[i].first);
    out += i ? ",\n" : "\n";
    ObjectWriter row(out);
    row.string("api", runtime ? "runtime" : "driver").uint("cbid", cbid);
    if (namer) row.string("name", namer(runtime, cbid));
    row.uint("calls", counts[i].second);
  }
  out += "],\n";

  append_key(out, "markers");
  out += '[';
  for (size_t i = 0; i < markers_.size(); ++i) {
    const MarkerRow& m = markers_[i];
    out += i ? ",\n" : "\n";
    ObjectWriter row(out);
    row.uint("id", m.id).string("kind", m.kind).uint("time", m.time).uint("thread", m.thread);
    if (!m.name.empty()) row.string("name", m.name);
    if (!m.domain.empty()) row.string("domain", m.domain);
  }
  out += "]}\n";
  return out;
}

}  // namespace kforge::inject
