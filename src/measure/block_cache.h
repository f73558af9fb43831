// Torch's CPU allocations of 32 MiB and more kept for reuse by size (see block_cache.cpp).
#pragma once

#include <cstddef>

namespace opfuse::measure {

// From the first call on, for the life of the process; idle blocks up to `limit` bytes are kept,
// beyond it they go back to the system. Later calls change nothing.
void keep_large_blocks(size_t limit);

}  // namespace opfuse::measure
