// A profiler for LibTorch builds without Kineto (Debian's): RecordFunction observers collect
// every operator, backward node and user scope, and a writer streams them as a Chrome trace in
// PyTorch's Kineto layout (cpu_op / user_annotation events, fwdbwd flows), gzipped for *.gz.
#pragma once

#include <nlohmann/json.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace opfuse::profile {

// Opens a user scope (cat "user_annotation") while it lives, e.g. a module path or
// "ProfilerStep#3"; ops inside carry the innermost module path as "Module Hierarchy".
// Costs one branch when no profiler is running.
class Scope {
 public:
  explicit Scope(const std::string& name);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void* guard_ = nullptr;
};

// One process-wide session (RecordFunction's callbacks are global).
class Profiler {
 public:
  Profiler();  // throws std::logic_error if another profiler is running
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;
  void start();
  void stop();
  size_t event_count() const;
  // Streams the trace to path (gzip when it ends in .gz); metadata goes to the top-level
  // "opfuse" object. Throws std::runtime_error naming the file on I/O failure.
  void write(const std::string& path, const nlohmann::json& metadata) const;
};

// What records a profiled step: opfuse's Profiler (opfuse_recorder) or one a front end brings
// (from Python, torch.profiler). Its scopes name the step ("ProfilerStep#3") and each module's
// forward, as user annotations.
class Recorder {
 public:
  virtual ~Recorder() = default;
  virtual void start() = 0;
  virtual void stop() = 0;
  virtual void push_scope(const std::string& name) = 0;
  virtual void pop_scope() = 0;  // closes the innermost open scope
  // metadata: JSON text, written as the trace's top-level "opfuse" object.
  virtual void write(const std::string& path, const std::string& metadata) = 0;
};

// opfuse's own Profiler as a Recorder; throws std::logic_error if another is running.
std::shared_ptr<Recorder> opfuse_recorder();

// Bytes a model holds on the CPU between steps, each storage counted once, by what:
// "parameters", "optimizer state" (the tensors of torch::optim's SGD, Adam and AdamW states),
// "inputs" (batches kept for every step). A profile's allocations cannot show them, as they were
// made before it: written as the trace's "memory_before", analyze adds them to the peak.
// Gradients are left out: a training step drops them first.
std::map<std::string, int64_t> held_memory(const std::vector<at::Tensor>& parameters,
                                           const torch::optim::Optimizer* optimizer,
                                           const std::vector<at::Tensor>& inputs);

}  // namespace opfuse::profile
