// The reader's chunked path on bytes in memory, whatever their size, so tests and the fuzz
// target can cut small inputs into many chunks. Internal: not part of the public API.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "opfuse/trace.h"

namespace opfuse::trace::detail {

// As parse_trace, with chunks of about `chunk_bytes` (the reader uses 1 MB for files of 16 MB and
// more). It falls back to one piece as the reader does: Trace::chunks says which path ran.
Trace parse_trace_chunked(std::string_view json, const std::string& name, size_t chunk_bytes);

}  // namespace opfuse::trace::detail
