// RecordFunction observers → compact per-thread event records.
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
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
  std::string dims, types;
};

// Each thread appends to its own buffer; the registry only takes a lock when a thread first
// records, so the observers never contend.
struct ThreadBuffer {
  std::mutex mutex;  // uncontended while recording; taken by write/event_count/clear
  uint64_t tid = 0;
  std::vector<Event> events;
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
void describe_inputs(const at::RecordFunction& fn, std::string& dims, std::string& types) {
  dims = "[";
  types = "[";
  bool first = true;
  for (const c10::IValue& v : fn.inputs()) {
    if (!first) {
      dims += ", ";
      types += ", ";
    }
    first = false;
    if (v.isTensor() && v.toTensor().defined()) {
      const at::Tensor& t = v.toTensor();
      dims += "[";
      for (int64_t d = 0; d < t.dim(); ++d) dims += (d ? ", " : "") + std::to_string(t.size(d));
      dims += "]";
      types += std::string("\"") + c10::toString(t.scalar_type()) + "\"";
    } else {
      dims += "[]";
      types += v.isScalar() ? "\"Scalar\"" : v.isNone() ? "\"\"" : "\"" + v.tagKind() + "\"";
    }
  }
  dims += "]";
  types += "]";
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  auto ctx = std::make_unique<Context>();
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    const std::string name = fn.name();
    if (name.rfind("ProfilerStep#", 0) != 0) buffer().modules.push_back(name);
    ctx->dims = "[]";
    ctx->types = "[]";
  } else {
    describe_inputs(fn, ctx->dims, ctx->types);
  }
  ctx->start_ns = now_ns();
  return ctx;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext* base) {
  const int64_t end = now_ns();
  auto* ctx = static_cast<Context*>(base);
  ThreadBuffer& b = buffer();
  Event e;
  e.name = fn.name();
  e.start_ns = ctx->start_ns;
  e.end_ns = end;
  e.tid = fn.threadId() != 0 ? fn.threadId() : b.tid;  // RecordFunction's ids, which forwardThreadId() uses
  e.sequence_nr = fn.seqNr();
  e.forward_tid = fn.forwardThreadId();
  e.kind = fn.scope() == at::RecordScope::USER_SCOPE       ? EventKind::user_annotation
           : fn.scope() == at::RecordScope::BACKWARD_FUNCTION ? EventKind::backward
                                                              : EventKind::op;
  e.external_id = next_external_id++;
  e.input_dims = std::move(ctx->dims);
  e.input_types = std::move(ctx->types);
  if (e.kind == EventKind::user_annotation && !b.modules.empty() && b.modules.back() == e.name) b.modules.pop_back();
  if (!b.modules.empty()) e.module = b.modules.back();
  // An op that began before stop() still ends here afterwards, perhaps while write() reads.
  std::lock_guard<std::mutex> lock(b.mutex);
  b.events.push_back(std::move(e));
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
    b->events.clear();
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
  running = true;
}

void Profiler::stop() {
  if (!running) return;
  at::removeCallback(handle);
  running = false;
}

size_t Profiler::event_count() const {
  std::lock_guard<std::mutex> lock(registry_mutex);
  size_t n = 0;
  for (const auto& b : registry()) {
    std::lock_guard<std::mutex> buffer_lock(b->mutex);
    n += b->events.size();
  }
  return n;
}

void Profiler::write(const std::string& path, const nlohmann::json& metadata) const {
  std::vector<Event> copy;  // a snapshot, so late events cannot move what is being written
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    for (const auto& b : registry()) {
      std::lock_guard<std::mutex> buffer_lock(b->mutex);
      copy.insert(copy.end(), b->events.begin(), b->events.end());
    }
  }
  std::vector<const Event*> events;
  for (const auto& e : copy) events.push_back(&e);
  write_trace(path, events, metadata);
}

}  // namespace opfuse::profile
