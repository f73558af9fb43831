// image_folder_source: DIR/<class>/<image> decoded by background threads, a few batches ahead.
//
// The sample stream is the concatenation of per-epoch permutations, cut into consecutive batches
// (a batch may straddle two epochs). Batch k always holds the same images for a given seed, however
// many threads decode: workers claim batch indices in order and next() hands them out in order.
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include "opfuse/data.h"
#include "train/image_decode.h"

namespace opfuse::data {
namespace {

namespace fs = std::filesystem;

struct Sample {
  std::string path;
  int64_t label;
};

struct Folder {
  std::vector<std::string> classes;  // sorted; the index is the label
  std::vector<Sample> samples;       // by class, then by file name
};

bool is_image_name(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

std::vector<fs::path> sorted_entries(const fs::path& dir, bool want_dirs) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (want_dirs ? entry.is_directory() : entry.is_regular_file() && is_image_name(entry.path()))
      out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

Folder scan_folder(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw std::invalid_argument(fmt::format("{}: no such folder", dir));
  if (!fs::is_directory(dir, ec)) throw std::invalid_argument(fmt::format("{}: not a folder", dir));
  Folder folder;
  try {
    for (const fs::path& class_dir : sorted_entries(dir, true)) {
      const auto label = static_cast<int64_t>(folder.classes.size());
      folder.classes.push_back(class_dir.filename().string());
      for (const fs::path& file : sorted_entries(class_dir, false)) folder.samples.push_back({file.string(), label});
    }
  } catch (const fs::filesystem_error& e) {
    throw std::invalid_argument(fmt::format("{}: cannot list {} ({})", dir, e.path1().string(), e.code().message()));
  }
  if (folder.classes.empty()) throw std::invalid_argument(fmt::format("{}: no class subfolders", dir));
  if (folder.samples.empty())
    throw std::invalid_argument(fmt::format("{}: no .jpg/.jpeg/.png images in any class subfolder", dir));
  return folder;
}

// Fisher–Yates over mt19937_64, whose output the standard fixes, rather than std::shuffle, whose
// algorithm it does not: the same seed gives the same order with any standard library.
std::vector<size_t> epoch_order(size_t n, uint64_t seed, uint64_t epoch) {
  std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * (epoch + 1)));
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  return order;
}

struct Job {
  int64_t index = 0;
  std::vector<const Sample*> samples;
};

// A decoded batch, or the exception that stopped it, to be rethrown by next() on the caller's thread.
struct Result {
  Batch batch;
  std::exception_ptr error;
};

class ImageFolderSource : public BatchSource {
 public:
  ImageFolderSource(std::string dir, Folder folder, int64_t batch_size, int64_t image_size, uint64_t seed,
                    int decode_threads)
      : dir_(std::move(dir)),
        folder_(std::move(folder)),
        batch_size_(batch_size),
        image_size_(image_size),
        seed_(seed),
        window_(decode_threads + 1) {
    try {
      for (int t = 0; t < decode_threads; ++t) workers_.emplace_back([this] { work(); });
    } catch (...) {
      stop();
      throw;
    }
  }

  ~ImageFolderSource() override { stop(); }

  Batch next() override {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_cv_.wait(lock, [&] { return ready_.count(next_return_) > 0 || broken_; });
    if (ready_.count(next_return_) == 0) std::rethrow_exception(broken_);
    Result result = std::move(ready_.extract(next_return_).mapped());
    ++next_return_;
    lock.unlock();
    space_cv_.notify_all();
    if (result.error) std::rethrow_exception(result.error);
    return std::move(result.batch);
  }

  int64_t num_classes() const override { return static_cast<int64_t>(folder_.classes.size()); }

  std::string describe() const override {
    return fmt::format("image folder {}: {} images, {} classes", dir_, folder_.samples.size(), folder_.classes.size());
  }

 private:
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    space_cv_.notify_all();
    for (auto& w : workers_) w.join();
  }

  // Image errors travel with their batch; anything else (out of memory while claiming) breaks the
  // source for good, so that next() throws instead of waiting for a batch nobody will make.
  void work() {
    try {
      decode_forever();
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!broken_) broken_ = std::current_exception();
      }
      ready_cv_.notify_all();
    }
  }

  // Claims stay at most window_ batches ahead of next(), which bounds the memory held in batches.
  void decode_forever() {
    while (true) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        space_cv_.wait(lock, [&] { return stopping_ || next_claim_ < next_return_ + window_; });
        if (stopping_) return;
        job = claim_locked();
      }
      Result result = decode_batch(job);
      if (stopping_) return;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ready_.emplace(job.index, std::move(result));
      }
      ready_cv_.notify_all();
    }
  }

  // Batches are claimed in index order, so stream positions only grow and one cached epoch order
  // suffices.
  Job claim_locked() {
    Job job;
    job.index = next_claim_++;
    const size_t n = folder_.samples.size();
    for (int64_t i = 0; i < batch_size_; ++i) {
      const uint64_t position = static_cast<uint64_t>(job.index * batch_size_ + i);
      const uint64_t epoch = position / n;
      if (order_.empty() || epoch != order_epoch_) order_ = epoch_order(n, seed_, order_epoch_ = epoch);
      job.samples.push_back(&folder_.samples[order_[position % n]]);
    }
    return job;
  }

  Result decode_batch(const Job& job) {
    Result result;
    try {
      const int64_t s = image_size_;
      at::Tensor images = at::empty({batch_size_, 3, s, s}, at::kFloat);
      at::Tensor labels = at::empty({batch_size_}, at::kLong);
      for (int64_t i = 0; i < batch_size_ && !stopping_; ++i) {
        resize_crop_normalize(decode_image(job.samples[i]->path, s), s, images.data_ptr<float>() + i * 3 * s * s);
        labels.data_ptr<int64_t>()[i] = job.samples[i]->label;
      }
      result.batch = {images, labels};
    } catch (...) {
      result.error = std::current_exception();
    }
    return result;
  }

  const std::string dir_;
  const Folder folder_;
  const int64_t batch_size_, image_size_;
  const uint64_t seed_;
  const int64_t window_;

  std::mutex mutex_;
  std::condition_variable ready_cv_, space_cv_;
  std::atomic<bool> stopping_{false};
  int64_t next_claim_ = 0, next_return_ = 0;
  std::vector<size_t> order_;
  uint64_t order_epoch_ = 0;
  std::map<int64_t, Result> ready_;
  std::exception_ptr broken_;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<BatchSource> image_folder_source(const std::string& dir, int64_t batch_size, int64_t image_size,
                                                 uint64_t seed, int decode_threads) {
  if (batch_size < 1) throw std::invalid_argument(fmt::format("{}: batch size must be at least 1, got {}", dir, batch_size));
  if (image_size < 1) throw std::invalid_argument(fmt::format("{}: image size must be at least 1, got {}", dir, image_size));
  if (decode_threads < 1)
    throw std::invalid_argument(fmt::format("{}: decode threads must be at least 1, got {}", dir, decode_threads));
  return std::make_unique<ImageFolderSource>(dir, scan_folder(dir), batch_size, image_size, seed, decode_threads);
}

}  // namespace opfuse::data
