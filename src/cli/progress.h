// A one-line progress bar on stderr, drawn only when stderr is a terminal (never into logs).
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
    if (!enabled_ || total <= 0) return;
    constexpr int kWidth = 30;
    const int filled = kWidth * done / total;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    const double eta = done > 0 ? elapsed * (total - done) / done : 0;
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
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point start_ = Clock::now();
};

}  // namespace opfuse::cli
