// Summary statistics shared by the benchmarks and the training meter.
#pragma once

#include <algorithm>
#include <vector>

namespace opfuse {

// The middle value (mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> xs) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

}  // namespace opfuse
