// What tune works on: a model with the inputs of its forward, a loss from its output and an
// optimizer. The C++ models (built-in EfficientNet, TorchScript) and Python models (the opfuse
// package implements this class in Python) are all Workloads, so one loop serves both front ends.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "opfuse/analyze.h"

namespace opfuse::profile {
class Recorder;  // opfuse/profile.h
}

namespace opfuse::tune {

// One training-mode forward and backward: every tensor the forward returned and every parameter's
// gradient (undefined where none flowed), named, in the model's stable order; and, where the
// workload reports it, what its optimizer does to each parameter in a fresh optimizer's first
// steps from gradients drawn from the probe's seed (the same in both models, so a rewrite of the
// optimizer is verified on its own arithmetic, apart from the model's).
struct Probe {
  std::vector<at::Tensor> outputs;
  std::vector<std::pair<std::string, at::Tensor>> grads;
  std::vector<std::pair<std::string, at::Tensor>> updates;
};

class Workload;

// One way to answer a rule's finding on a workload. apply rewrites the workload in place and
// returns how many places changed (0: it does not apply here).
struct Rewrite {
  std::string rule;  // the analyze rule whose finding it answers ("silu")
  std::string name;  // what it does, for people: "Swish modules → opfuse::silu"
  std::function<int(Workload&)> apply;
};

class Workload {
 public:
  virtual ~Workload() = default;
  virtual std::string name() const = 0;
  // What has been rewritten so far, e.g. "swish=fused se_gate=composite".
  virtual std::string describe() const = 0;
  // Samples one step trains on (the batch size), for the throughput.
  virtual int64_t samples_per_step() const = 0;
  // What one sample is, for the throughput's label: "images", "sequences", "samples".
  virtual std::string sample_unit() const { return "samples"; }
  // Its own copy of every parameter and buffer, a fresh optimizer, the same inputs.
  virtual std::shared_ptr<Workload> clone() const = 0;
  // One training step (forward, loss, backward, optimizer); returns its milliseconds.
  virtual double step() = 0;
  // Converts to dtype and runs one training-mode forward and backward on the first inputs with the
  // random streams seeded by `seed` (then, optionally, optimizer steps from seeded gradients);
  // floating inputs are scaled by (1 + nudge · noise) first, to see how far
  // rounding-sized changes carry. Callers run it on a clone.
  virtual Probe probe(at::ScalarType dtype, uint64_t seed, double nudge) = 0;
  // The rewrites that may answer this rule on this kind of workload.
  virtual std::vector<Rewrite> rewrites_for(const analyze::Rule& rule) const = 0;
  // Called around profiled steps with the recorder profiling them, then with nullptr: a Python
  // model opens a scope per module in it only then.
  virtual void set_profiling(profile::Recorder* /*recorder*/) {}
  // Called with true before its steps are timed against other variants, with false after: a
  // Python model tuned for torch.compile runs its timed steps compiled, while its profiled steps
  // (whose ops the rules read) and its probes stay eager.
  virtual void set_measuring(bool /*on*/) {}
  // Bytes held on the CPU between steps by what ("parameters", "optimizer state", "inputs"),
  // written with a profile (see profile::held_memory); empty when not known.
  virtual std::map<std::string, int64_t> held_memory() { return {}; }
  // Why the last rewrite applied to it changed nothing, where it knows more than that nothing
  // matched (a chain found whose value is used outside it); empty otherwise.
  virtual std::string why_unchanged() const { return ""; }
  // Writes the model so it can be used; returns the paths written.
  virtual std::vector<std::string> save(const std::string& path_without_extension) const = 0;

  // The processes that train this workload together (torch.distributed ranks; its step is
  // collective) and this one's place among them. The loop takes every decision on what all ranks
  // saw, so that all take the same ones. A lone process is a group of one.
  virtual int rank() const { return 0; }
  virtual int ranks() const { return 1; }
  // Every rank's `mine`, by rank. Collective: every rank calls it at the same point of the loop;
  // throws, naming the rank, when one has gone.
  virtual std::vector<std::string> gather(const std::string& mine) const { return {mine}; }
};

}  // namespace opfuse::tune
