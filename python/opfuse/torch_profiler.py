"""torch.profiler in the place of opfuse's own profiler: ``opfuse.profile(..., profiler="torch")``."""
import json
import os

import torch
from torch.autograd.profiler import record_function


class TorchProfiler:
    """Records as opfuse's profiler does, with torch.profiler (Kineto): each op with its input
    shapes, the allocations (profile_memory), and the step and module scopes opfuse opens as
    record_function ranges (user annotations, which analyze names a finding's place by). Writes
    torch's own Chrome trace, with opfuse's metadata added under "opfuse"."""

    def __init__(self):
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
        self._open.pop().__exit__(None, None, None)

    def write(self, path, metadata_json):
        partial = path + ".partial"
        self._profile.export_chrome_trace(partial)
        with open(partial) as f:
            trace = json.load(f)
        trace["opfuse"] = dict(json.loads(metadata_json), profiler="torch.profiler")
        with open(partial, "w") as f:
            json.dump(trace, f)
        os.replace(partial, path)
