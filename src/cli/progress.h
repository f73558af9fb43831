// Progress on stderr: a one-line bar redrawn in place when stderr is a terminal; into a log, a
// plain line at most every kLogEvery seconds, so a long run in CI or under nohup is not silent.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace opfuse::cli {

class Progress {
 public:
  explicit Progress(std::string label) : label_(std::move(label)), enabled_(isatty(fileno(stderr)) != 0) {}
  ~Progress() { clear(); }

  void update(int done, int total) {
    if (total <= 0) return;
    constexpr int kWidth = 30;
    const int filled = kWidth * done / total;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    const double eta = done > 0 ? elapsed * (total - done) / done : 0;
    if (!enabled_) {
      if (elapsed - logged_at_ < kLogEvery || done >= total) return;
      logged_at_ = elapsed;
      std::fprintf(stderr, "%s %d/%d after %.0fs, eta %.0fs\n", label_.empty() ? "progress" : label_.c_str(), done,
                   total, elapsed, eta);
      return;
    }
    std::fprintf(stderr, "\r%s [%s%s] %d/%d  eta %.0fs ", label_.c_str(), std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(), done, total, eta);
    std::fflush(stderr);
    drawn_ = true;
  }

  void clear() {
    if (!drawn_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr double kLogEvery = 10;
  double logged_at_ = 0;
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point start_ = Clock::now();
};

}  // namespace opfuse::cli
