// RecordFunction observers → compact per-thread event records.
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <vector>

#include "opfuse/profile.h"
#include "profile/events.h"

namespace opfuse::profile {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Context : at::ObserverContext {
  int64_t start_ns = 0;
  std::string dims, strides, types;
};

// One recorded event, its strings as ids into its thread's table.
struct Record {
  uint32_t name = 0, input_dims = 0, input_strides = 0, input_types = 0, module = 0;
  EventKind kind = EventKind::op;
  int64_t start_ns = 0, end_ns = 0;
  uint64_t tid = 0, forward_tid = 0;
  int64_t sequence_nr = -1, external_id = 0;
};

// Records live in blocks mapped apart from malloc's heap. Kept on the heap, thousands of
// long-lived records per step sat between the step's tensors, so their freed memory could not
// be reused whole: each profiled step faulted in fresh pages (B0 at 224 px: +335 MB of RSS and
// up to +90 % step time, growing step by step). Strings repeat, so each is stored once per thread.
template <class T>
class BlockLog {
 public:
  BlockLog() = default;
  BlockLog(const BlockLog&) = delete;
  BlockLog& operator=(const BlockLog&) = delete;
  ~BlockLog() { clear(); }

  void push_back(const T& r) {
    if (size_ % kPerBlock == 0 && size_ / kPerBlock == blocks_.size()) {
      void* block = mmap(nullptr, kPerBlock * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (block == MAP_FAILED) throw std::bad_alloc();
      blocks_.push_back(static_cast<T*>(block));
    }
    new (&blocks_[size_ / kPerBlock][size_ % kPerBlock]) T(r);
    ++size_;
  }
  const T& operator[](size_t i) const { return blocks_[i / kPerBlock][i % kPerBlock]; }
  size_t size() const { return size_; }
  void clear() {
    for (T* b : blocks_) munmap(b, kPerBlock * sizeof(T));
    blocks_.clear();
    size_ = 0;
  }

 private:
  static constexpr size_t kPerBlock = (size_t{4} << 20) / sizeof(T);
  std::vector<T*> blocks_;
  size_t size_ = 0;
};

class RecordLog : public BlockLog<Record> {
 public:
  RecordLog() { intern(""); }  // id 0: no string (a record without a module)

  uint32_t intern(const std::string& s) {
    const auto [it, fresh] = ids_.try_emplace(s, static_cast<uint32_t>(strings_.size()));
    if (fresh) strings_.push_back(&it->first);
    return it->second;
  }
  const std::string& string(uint32_t id) const { return *strings_[id]; }

 private:
  std::unordered_map<std::string, uint32_t> ids_;  // nodes do not move: strings_ points into them
  std::vector<const std::string*> strings_;
};

// Each thread appends to its own buffer; the registry only takes a lock when a thread first
// records, so the observers never contend.
struct ThreadBuffer {
  std::mutex mutex;  // uncontended while recording; taken by write/event_count/clear
  uint64_t tid = 0;
  RecordLog records;
  BlockLog<Allocation> memory;
  std::vector<std::string> modules;  // open module scopes, innermost last
};

std::mutex registry_mutex;
std::vector<std::unique_ptr<ThreadBuffer>>& registry() {
  static std::vector<std::unique_ptr<ThreadBuffer>> buffers;
  return buffers;
}
std::atomic<uint64_t> next_tid{1};
std::atomic<int64_t> next_external_id{1};
std::atomic<bool> running{false};
std::atomic<bool> claimed{false};
at::CallbackHandle handle = 0;

ThreadBuffer& buffer() {
  thread_local ThreadBuffer* mine = nullptr;
  if (mine == nullptr) {
    auto owned = std::make_unique<ThreadBuffer>();
    owned->tid = next_tid++;
    mine = owned.get();
    std::lock_guard<std::mutex> lock(registry_mutex);
    registry().push_back(std::move(owned));
  }
  return *mine;
}

// "[[16, 3, 224, 224], [32, 3, 3, 3], []]" and "[\"float\", \"float\", \"Scalar\"]".
void append_array(std::string& out, c10::IntArrayRef values) {
  out += "[";
  for (size_t d = 0; d < values.size(); ++d) out += (d ? ", " : "") + std::to_string(values[d]);
  out += "]";
}

// Sizes, strides (Kineto's "Input Strides": the layout a channels-last rule asks about) and types.
void describe_inputs(const at::RecordFunction& fn, Context& ctx) {
  ctx.dims = ctx.strides = ctx.types = "[";
  bool first = true;
  for (const c10::IValue& v : fn.inputs()) {
    if (!first) {
      ctx.dims += ", ";
      ctx.strides += ", ";
      ctx.types += ", ";
    }
    first = false;
    if (v.isTensor() && v.toTensor().defined()) {
      const at::Tensor& t = v.toTensor();
      append_array(ctx.dims, t.sizes());
      // a sparse or nested tensor has no strides
      append_array(ctx.strides, t.layout() == at::kStrided && !t.is_nested() ? t.strides() : c10::IntArrayRef{});
      ctx.types += std::string("\"") + c10::toString(t.scalar_type()) + "\"";
    } else {
      ctx.dims += "[]";
      ctx.strides += "[]";
      ctx.types += v.isScalar() ? "\"Scalar\"" : v.isNone() ? "\"\"" : "\"" + v.tagKind() + "\"";
    }
  }
  ctx.dims += "]";
  ctx.strides += "]";
  ctx.types += "]";
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  auto ctx = std::make_unique<Context>();
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    const std::string name = fn.name();
    if (name.rfind("ProfilerStep#", 0) != 0) buffer().modules.push_back(name);
    ctx->dims = ctx->strides = ctx->types = "[]";
  } else {
    describe_inputs(fn, *ctx);
  }
  ctx->start_ns = now_ns();
  return ctx;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext* base) {
  const int64_t end = now_ns();
  auto* ctx = static_cast<Context*>(base);
  ThreadBuffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mutex);  // an op that began before stop() may end while write() reads
  Record e;
  e.name = b.records.intern(fn.name());
  e.start_ns = ctx->start_ns;
  e.end_ns = end;
  e.tid = fn.threadId() != 0 ? fn.threadId() : b.tid;  // RecordFunction's ids, which forwardThreadId() uses
  e.sequence_nr = fn.seqNr();
  e.forward_tid = fn.forwardThreadId();
  e.kind = fn.scope() == at::RecordScope::USER_SCOPE       ? EventKind::user_annotation
           : fn.scope() == at::RecordScope::BACKWARD_FUNCTION ? EventKind::backward
                                                              : EventKind::op;
  e.external_id = next_external_id++;
  e.input_dims = b.records.intern(ctx->dims);
  e.input_strides = b.records.intern(ctx->strides);
  e.input_types = b.records.intern(ctx->types);
  if (e.kind == EventKind::user_annotation && !b.modules.empty() && b.modules.back() == fn.name()) b.modules.pop_back();
  if (!b.modules.empty()) e.module = b.records.intern(b.modules.back());
  b.records.push_back(e);
}

// Allocations: the allocators report each allocation and free to the PROFILER_STATE debug
// info of the thread that makes it, while it says memory profiling is on. torch reads that slot
// as its own profilers' state (autograd asks it for the profiler's config), so the reporter is
// one: a disabled profiler state that only takes memory reports. Its thread id is
// RecordFunction's, as the ops'.
struct MemoryReporter : torch::profiler::impl::ProfilerStateBase {
  MemoryReporter()
      : ProfilerStateBase(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::Disabled,
                                                                /*report_input_shapes=*/false, /*profile_memory=*/true)) {}
  torch::profiler::impl::ActiveProfilerType profilerType() override { return torch::profiler::impl::ActiveProfilerType::NONE; }
  void reportMemoryUsage(void* ptr, int64_t bytes, size_t total_allocated, size_t total_reserved, c10::Device device) override {
    if (!running.load(std::memory_order_relaxed)) return;
    Allocation a;
    a.ts_ns = now_ns();
    a.tid = at::RecordFunction::currentThreadId();
    a.addr = reinterpret_cast<uint64_t>(ptr);
    a.bytes = bytes;
    a.total_allocated = static_cast<int64_t>(total_allocated);
    a.total_reserved = static_cast<int64_t>(total_reserved);
    a.device_type = static_cast<int>(device.type());
    a.device_index = device.index();
    ThreadBuffer& b = buffer();
    std::lock_guard<std::mutex> lock(b.mutex);
    b.memory.push_back(a);
  }
  bool memoryProfilingEnabled() const override { return running.load(std::memory_order_relaxed); }
};
std::thread::id reporting_thread;  // where start() pushed the reporter, so stop() pops it there

// The profiler state in this thread's slot: getTLS() in current torch, get(/*global=*/false) in 2.7
// and before.
template <class State>
auto thread_state(int) -> decltype(State::getTLS()) {
  return State::getTLS();
}
template <class State>
State* thread_state(long) {
  return State::get(/*global=*/false);
}
using torch::profiler::impl::ProfilerStateBase;

Event event_of(const RecordLog& log, const Record& r) {
  Event e;
  e.name = log.string(r.name);
  e.start_ns = r.start_ns, e.end_ns = r.end_ns;
  e.tid = r.tid, e.forward_tid = r.forward_tid;
  e.sequence_nr = r.sequence_nr, e.external_id = r.external_id;
  e.kind = r.kind;
  e.input_dims = log.string(r.input_dims), e.input_strides = log.string(r.input_strides);
  e.input_types = log.string(r.input_types);
  e.module = log.string(r.module);
  return e;
}

}  // namespace

Scope::Scope(const std::string& name) {
  if (!running.load(std::memory_order_relaxed)) return;
  auto* guard = new at::RecordFunction(at::RecordScope::USER_SCOPE);
  if (guard->isActive()) guard->before(name);
  guard_ = guard;
}

Scope::~Scope() { delete static_cast<at::RecordFunction*>(guard_); }

Profiler::Profiler() {
  if (claimed.exchange(true)) throw std::logic_error("another opfuse profiler is already running");
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (auto& b : registry()) {
    std::lock_guard<std::mutex> buffer_lock(b->mutex);
    b->records.clear();
    b->memory.clear();
  }
}

Profiler::~Profiler() {
  stop();
  claimed = false;
}

void Profiler::start() {
  if (running) return;
  handle = at::addGlobalCallback(
      at::RecordFunctionCallback(on_enter, on_exit).needsInputs(true).needsIds(true).scopes(
          {at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION, at::RecordScope::USER_SCOPE}));
  // Under another profiler (torch.profiler) that one keeps the slot, and allocations go unrecorded.
  if (thread_state<ProfilerStateBase>(0) == nullptr) {
    ProfilerStateBase::push(std::make_shared<MemoryReporter>());
    reporting_thread = std::this_thread::get_id();
  }
  running = true;
}

void Profiler::stop() {
  if (!running) return;
  at::removeCallback(handle);
  running = false;
  // Stopped on another thread, the reporter stays on the starting thread's stack, silent.
  if (std::this_thread::get_id() == reporting_thread &&
      dynamic_cast<MemoryReporter*>(thread_state<ProfilerStateBase>(0)) != nullptr)
    ProfilerStateBase::pop(/*global=*/false);
  reporting_thread = {};
}

size_t Profiler::event_count() const {
  std::lock_guard<std::mutex> lock(registry_mutex);
  size_t n = 0;
  for (const auto& b : registry()) {
    std::lock_guard<std::mutex> buffer_lock(b->mutex);
    n += b->records.size() + b->memory.size();
  }
  return n;
}

void Profiler::write(const std::string& path, const nlohmann::json& metadata) const {
  std::vector<Event> copy;  // a snapshot, so late events cannot move what is being written
  std::vector<Allocation> memory;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    for (const auto& b : registry()) {
      std::lock_guard<std::mutex> buffer_lock(b->mutex);
      for (size_t i = 0; i < b->records.size(); ++i) copy.push_back(event_of(b->records, b->records[i]));
      for (size_t i = 0; i < b->memory.size(); ++i) memory.push_back(b->memory[i]);
    }
  }
  std::vector<const Event*> events;
  for (const auto& e : copy) events.push_back(&e);
  write_trace(path, events, memory, metadata);
}

namespace {

class ProfilerRecorder : public Recorder {
 public:
  void start() override { profiler_.start(); }
  void stop() override { profiler_.stop(); }
  void push_scope(const std::string& name) override { scopes_.push_back(std::make_unique<Scope>(name)); }
  void pop_scope() override {
    if (!scopes_.empty()) scopes_.pop_back();
  }
  void write(const std::string& path, const std::string& metadata) override {
    profiler_.write(path, nlohmann::json::parse(metadata));
  }

 private:
  Profiler profiler_;
  std::vector<std::unique_ptr<Scope>> scopes_;
};

}  // namespace

std::shared_ptr<Recorder> opfuse_recorder() { return std::make_shared<ProfilerRecorder>(); }

}  // namespace opfuse::profile
