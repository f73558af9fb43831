"""torch.profiler in the place of opfuse's own profiler: ``opfuse.profile(..., profiler="torch")``
and ``opfuse.tune(..., profiler="torch")``."""
import json
import os

import torch
from torch.autograd.profiler import record_function


def make(native):
    """The TorchProfiler class: a Recorder of this process's opfuse._C, which the C++ profiling loop
    (tune's, opfuse.profile's) starts, scopes, stops and writes."""

    class TorchProfiler(native.Recorder):
        """Records as opfuse's profiler does, with torch.profiler (Kineto): each op with its input
        shapes, the allocations (profile_memory), and the step and module scopes as record_function
        ranges (user annotations, which analyze names a finding's place by). Writes torch's own
        Chrome trace, with opfuse's metadata added under "opfuse"."""

        def __init__(self):
            native.Recorder.__init__(self)
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profile = torch.profiler.profile(activities=activities, record_shapes=True, profile_memory=True)
            self._open = []

        def start(self):
            self._profile.start()

        def stop(self):
            self._profile.stop()

        def push_scope(self, name):
            scope = record_function(name)
            scope.__enter__()
            self._open.append(scope)

        def pop_scope(self):
            if self._open:
                self._open.pop().__exit__(None, None, None)

        def write(self, path, metadata):
            partial = path + ".partial"
            self._profile.export_chrome_trace(partial)
            with open(partial) as f:
                trace = json.load(f)
            trace["opfuse"] = dict(json.loads(metadata), profiler="torch.profiler")
            with open(partial, "w") as f:
                json.dump(trace, f)
            os.replace(partial, path)

    return TorchProfiler
