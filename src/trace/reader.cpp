// Trace files → Trace. A large file's event array is cut into chunks at event boundaries and
// the chunks are parsed on all cores, each into its own string table, and merged in file order
// as they finish. A plain file is mapped, not read: each chunk is copied out into a padded buffer and
// its pages handed back, so the file is never resident in this process all at once. A short first chunk is parsed before the others: its first timestamp is the origin
// they all measure from, so every ts is the same double as in a one-piece parse. A cut is only
// ever a guess (a "},{" could sit inside a string); a wrong one makes its chunk fail to parse,
// and any failure re-reads the whole file on one thread, which also gives the error its exact
// byte offset.
#include <fmt/format.h>
#include <simdjson.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "trace/chunked.h"
#include "trace/document.h"
#include "trace/huge_pages.h"

namespace opfuse::trace {
namespace {

using detail::Document;
using detail::TopLevel;

constexpr size_t kChunkBytes = size_t{1} << 20;  // small: each worker's parser buffers grow to ~5× this
constexpr size_t kFirstChunkBytes = size_t{64} << 10;  // parsed alone, before the others
constexpr size_t kParallelBytes = size_t{16} << 20;  // smaller files parse faster on one thread
constexpr size_t kMaxPrefixBytes = size_t{64} << 20;

// simdjson picks its on-demand kernel at compile time, so document.cpp is built for AVX2 too.
Trace parse_document(Document& doc) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") &&
                           __builtin_cpu_supports("pclmul");
  return avx2 ? detail::parse_document_haswell(doc) : detail::parse_document_generic(doc);
}

// Bytes with simdjson's padding allocated after them.
std::string padded(std::string_view text) {
  std::string s;
  s.reserve(text.size() + simdjson::SIMDJSON_PADDING);
  s.append(text);
  return s;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

// The offset just inside the event array's '[', or npos when the layout is not the usual one
// (then the whole file is parsed in one piece). For an object, the text before "traceEvents"
// must itself parse as the start of that object, one without events.
size_t events_begin(std::string_view json, const std::string& name, TopLevel& top) {
  size_t i = skip_space(json, 0);
  if (i < json.size() && json[i] == '[') return i + 1;
  if (i >= json.size() || json[i] != '{') return std::string_view::npos;
  const size_t key = json.find("\"traceEvents\"");
  if (key == std::string_view::npos || key > kMaxPrefixBytes) return std::string_view::npos;
  i = skip_space(json, key + 13);
  if (i >= json.size() || json[i] != ':') return std::string_view::npos;
  i = skip_space(json, i + 1);
  if (i >= json.size() || json[i] != '[') return std::string_view::npos;
  const std::string head = padded(std::string(json.substr(0, key)) + "\"traceEvents\":[]}");
  Document doc{head, name};
  try {
    parse_document(doc);
  } catch (const std::invalid_argument&) {
    return std::string_view::npos;
  }
  if (doc.entries > 0) return std::string_view::npos;  // an escaped "trace\u0045vents" before it
  top = doc.top;
  return i + 1;
}

// The offset of the ']' that closes the event array, or npos. An array must end the file. In an
// object, other keys may follow ("traceName", "deviceProperties", "opfuse" …): the earliest ']'
// near the end whose remainder reads as the rest of an object is the one, and that rest must
// hold no more events (a second "traceEvents" array is read in one piece).
size_t events_end(std::string_view json, size_t from, const std::string& name, TopLevel& top) {
  size_t last = json.size();
  while (last > from && is_space(json[last - 1])) --last;
  if (last == from) return std::string_view::npos;
  if (json[skip_space(json, 0)] == '[') return json[last - 1] == ']' ? last - 1 : std::string_view::npos;
  const size_t window = std::max(from, json.size() - std::min(json.size(), size_t{1} << 20));
  std::vector<size_t> candidates;
  for (size_t i = last; i-- > window && candidates.size() < 64;)
    if (json[i] == ']') candidates.push_back(i);
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    const std::string rest = padded("{\"traceEvents\":[" + std::string(json.substr(*it)));
    Document doc{rest, name};
    try {
      parse_document(doc);
    } catch (const std::invalid_argument&) {
      continue;
    }
    if (doc.entries > 0) return std::string_view::npos;
    top.add(doc.top);
    return *it;
  }
  return std::string_view::npos;
}

// The start of the first event after `from` that follows "},": a likely event boundary.
size_t next_boundary(std::string_view json, size_t from) {
  for (size_t comma = json.find(',', from); comma != std::string_view::npos; comma = json.find(',', comma + 1)) {
    size_t before = comma;
    while (before > 0 && is_space(json[before - 1])) --before;
    if (before == 0 || json[before - 1] != '}') continue;
    const size_t after = skip_space(json, comma + 1);
    if (after < json.size() && json[after] == '{') return after;
  }
  return std::string_view::npos;
}

bool is_begin_end(const Event& e) { return e.phase == 'B' || e.phase == 'E'; }

// Copies json[begin, begin + n) to `to`; false if the bytes could not be read.
using Copy = std::function<bool(size_t begin, size_t n, char* to)>;

// json[begin, begin + n), read with `copy` when there is one. A mapped file is never touched
// through its mapping: each touch would map a whole page-cache folio into this process, and
// the boundary lookups alone made most of a 109 MB file resident.
std::string_view bytes_at(std::string_view json, size_t begin, size_t n, const Copy& copy, std::string& buffer) {
  if (!copy) return json.substr(begin, n);
  buffer.resize(n);
  if (!copy(begin, n, buffer.data())) throw std::runtime_error("read failed");
  return buffer;
}

// Where each chunk starts; the last entry is the array's ']'. The first chunk is short: the
// others wait for its timestamps. Each boundary is looked for in a small window after the guess,
// grown while none is found.
std::vector<size_t> chunk_starts(std::string_view json, size_t begin, size_t end, size_t chunk_bytes,
                                 const Copy& copy) {
  std::vector<size_t> starts{begin};
  std::string buffer;
  for (size_t guess = begin + std::min(chunk_bytes, kFirstChunkBytes); guess < end;
       guess = starts.back() + chunk_bytes) {
    size_t at = std::string_view::npos;
    for (size_t n = size_t{16} << 10; at == std::string_view::npos; n *= 4) {
      const size_t len = std::min(n, end - guess);
      const size_t found = next_boundary(bytes_at(json, guess, len, copy, buffer), 0);
      if (found != std::string_view::npos) at = guess + found;
      else if (guess + len == end) break;
    }
    if (at == std::string_view::npos) break;
    starts.push_back(at);
  }
  starts.push_back(end);
  return starts;
}

// Chunk i as its own document, "[" + its events + "]", written into `out` (reused across chunks).
// The comma before the next chunk is dropped; one after the last event is kept, to be rejected
// as it is in one piece.
void chunk_document(std::string_view json, const std::vector<size_t>& starts, size_t i, const Copy& copy,
                    std::string& out) {
  const bool last = i + 2 == starts.size();
  const size_t n = starts[i + 1] - starts[i];
  out.reserve(n + 2 + simdjson::SIMDJSON_PADDING);
  out.resize(n + 1);
  out.front() = '[';
  if (!copy) std::memcpy(out.data() + 1, json.data() + starts[i], n);
  else if (!copy(starts[i], n, out.data() + 1)) throw std::runtime_error("read failed");
  size_t size = n + 1;
  while (size > 1 && (is_space(out[size - 1]) || (!last && out[size - 1] == ','))) --size;
  out.resize(size);
  out.push_back(']');
}

// Runs task(i) for i in [0, n) on all cores; returns false if any task threw.
bool run_parallel(size_t n, const std::function<void(size_t)>& task) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (size_t i; !failed && (i = next++) < n;) {
      try {
        task(i);
      } catch (const std::exception&) {
        failed = true;
      }
    }
  };
  const size_t workers = std::min<size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (size_t w = 1; w < workers; ++w) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  return !failed;
}

// Chunks go into the merged trace in file order as soon as they and every chunk before them
// are parsed, placed by whichever worker finished the last of them. A chunk's strings are
// re-interned into the merged table (string ids in pids, tids and flow ids too), so ids come out
// in file order, as in a one-piece parse. A placed chunk is freed at once: the chunks after it
// reuse its memory instead of faulting in fresh pages, and the parsed chunks are never all held
// beside the merged events. All chunks measured from the file's origin: timestamps need no shift.
class Merger {
 public:
  Merger(Trace& into, std::vector<Trace>& parts, const std::vector<size_t>& starts)
      : into_(into), parts_(parts), starts_(starts), parsed_(parts.size(), 0) {}

  void parsed(size_t p) {
    std::lock_guard<std::mutex> lock(mutex_);
    parsed_[p] = 1;
    if (into_.events.capacity() == 0) reserve_for(p);
    while (next_ < parts_.size() && parsed_[next_]) place(next_++);
  }
  bool complete() const { return next_ == parts_.size(); }
  bool begin_end() const { return begin_end_; }  // any B or E event, to be paired after the merge

 private:
  // The file's events, guessed from the first parsed chunk's bytes per event, with some room.
  void reserve_for(size_t p) {
    const double per_event = static_cast<double>(starts_[p + 1] - starts_[p]) / std::max<size_t>(1, parts_[p].events.size());
    const double total = static_cast<double>(starts_.back() - starts_.front()) / per_event;
    detail::reserve_huge(into_.events, static_cast<size_t>(total * 1.2) + 4096);
  }

  void place(size_t p) {
    Trace& part = parts_[p];
    map_.resize(part.strings.size());
    for (size_t i = 0; i < part.strings.size(); ++i) map_[i] = into_.intern(part.strings[i]);
    auto id = [&](int64_t v) { return v < 0 ? -1 - static_cast<int64_t>(map_[-1 - v]) : v; };
    for (Event e : part.events) {
      e.name = map_[e.name], e.category = map_[e.category], e.module = map_[e.module];
      e.dims = map_[e.dims], e.strides = map_[e.strides], e.types = map_[e.types], e.stack = map_[e.stack];
      e.pid = id(e.pid), e.tid = id(e.tid), e.flow_id = id(e.flow_id);
      begin_end_ |= is_begin_end(e);
      into_.events.push_back(e);
    }
    for (Allocation a : part.memory) {
      a.pid = id(a.pid), a.tid = id(a.tid);
      into_.memory.push_back(a);
    }
    for (auto& [pid, n] : part.process_names) into_.process_names[id(pid)] = n;
    for (auto& [tid, n] : part.thread_names) into_.thread_names[id(tid)] = n;
    into_.skipped += part.skipped;
    for (auto& w : part.warnings)
      if (into_.warnings.size() < 5) into_.warnings.push_back(std::move(w));
    part = Trace();
  }

  Trace& into_;
  std::vector<Trace>& parts_;
  const std::vector<size_t>& starts_;
  std::vector<char> parsed_;
  size_t next_ = 0;
  std::vector<uint32_t> map_;
  bool begin_end_ = false;
  std::mutex mutex_;
};

// A file's bytes, mapped read-only (gzip files are inflated into `inflated_` instead). The
// reader looks through the mapping for chunk boundaries, but reads each chunk's bytes with
// pread: straight from the page cache, with no page faults and without making the file part
// of this process's memory.
class Source {
 public:
  explicit Source(const std::string& path);
  ~Source() {
    if (map_ != nullptr) munmap(map_, size_);
    if (fd_ >= 0) close(fd_);
  }
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;
  std::string_view bytes() const { return map_ != nullptr ? std::string_view(static_cast<const char*>(map_), size_) : inflated_; }
  bool copy(size_t begin, size_t n, char* to) const {
    if (map_ == nullptr) {
      std::memcpy(to, inflated_.data() + begin, n);
      return true;
    }
    while (n > 0) {
      const ssize_t got = pread(fd_, to, n, static_cast<off_t>(begin));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      to += got, begin += static_cast<size_t>(got), n -= static_cast<size_t>(got);
    }
    return true;
  }

 private:
  int fd_ = -1;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::string inflated_;
};

bool parse_in_chunks(std::string_view json, const std::string& name, size_t chunk_bytes, const Copy& copy,
                     Trace& trace, TopLevel& top, bool& begin_end) {
  const size_t begin = events_begin(json, name, top);
  if (begin == std::string_view::npos) return false;
  const size_t end = events_end(json, begin, name, top);
  if (end == std::string_view::npos) return false;
  const std::vector<size_t> starts = chunk_starts(json, begin, end, chunk_bytes, copy);
  if (starts.size() < 3) return false;
  std::vector<Trace> parts(starts.size() - 1);
  Merger merger(trace, parts, starts);
  bool has_origin = false;
  int64_t origin_us = 0;
  auto parse_chunk = [&](size_t i) {
    thread_local std::string text;
    chunk_document(json, starts, i, copy, text);
    Document doc{text, name, static_cast<int64_t>(starts[i]) - 1, has_origin, origin_us};
    parts[i] = parse_document(doc);
    if (!has_origin) has_origin = doc.has_origin, origin_us = doc.origin_us;
    merger.parsed(i);
  };
  // One by one up to the first chunk with a timestamp, then the rest in parallel from its origin.
  size_t next = 0;
  for (; next < parts.size() && !has_origin; ++next)
    if (!run_parallel(1, [&](size_t) { parse_chunk(next); })) return false;
  if (!run_parallel(parts.size() - next, [&](size_t i) { parse_chunk(next + i); })) return false;
  if (!merger.complete()) return false;
  begin_end = merger.begin_end();
  trace.chunks = static_cast<int>(parts.size());
  trace.origin_us = origin_us;
  return true;
}

bool has_category(Trace& t, std::initializer_list<const char*> names) {
  std::vector<uint32_t> ids;
  for (const char* n : names) ids.push_back(t.intern(n));
  for (const Event& e : t.events)
    if (std::find(ids.begin(), ids.end(), e.category) != ids.end()) return true;
  return false;
}

Dialect detect(Trace& t, bool opfuse_metadata) {
  if (opfuse_metadata) return Dialect::opfuse;
  for (const auto& [pid, name] : t.process_names)
    if (name == "Ascend Hardware" || name == "CANN") return Dialect::ascend;
  if (has_category(t, {"cpu_op", "kernel", "cuda_runtime", "user_annotation"})) return Dialect::kineto;
  if (has_category(t, {"Operator", "Kernel", "Runtime"})) return Dialect::kineto_legacy_1_8;
  for (const Event& e : t.events)
    if (e.category == 0 && e.pid < 0 && t.strings[-1 - e.pid] == "CPU functions") return Dialect::legacy_profiler;
  return Dialect::unknown;
}

// gzip keeps the uncompressed size (mod 2^32) in its last four bytes: enough to size the buffer.
size_t expected_size(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return 0;
  const auto size = static_cast<size_t>(st.st_size);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return size;
  unsigned char magic[2] = {0, 0}, tail[4] = {0, 0, 0, 0};
  size_t expected = size;
  if (std::fread(magic, 1, 2, f) == 2 && magic[0] == 0x1f && magic[1] == 0x8b && std::fseek(f, -4, SEEK_END) == 0 &&
      std::fread(tail, 1, 4, f) == 4)
    expected = std::max(size, size_t{tail[0]} | size_t{tail[1]} << 8 | size_t{tail[2]} << 16 | size_t{tail[3]} << 24);
  std::fclose(f);
  return expected;
}

Source::Source(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw std::invalid_argument(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  unsigned char magic[2] = {0, 0};
  const bool gzipped = std::fread(magic, 1, 2, f) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  struct stat st {};
  const bool ok = fstat(fileno(f), &st) == 0;
  const int64_t file_bytes = ok ? static_cast<int64_t>(st.st_size) : 0;
  if (!gzipped) {
    size_ = static_cast<size_t>(file_bytes);
    if (ok && size_ > 0) {
      map_ = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fileno(f), 0);
      if (map_ == MAP_FAILED) map_ = nullptr;
      else fd_ = dup(fileno(f));
    }
    std::fclose(f);
    if (!ok || (size_ > 0 && (map_ == nullptr || fd_ < 0)))
      throw std::invalid_argument(fmt::format("{}: cannot read", path));
    return;
  }
  std::fclose(f);
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) throw std::invalid_argument(fmt::format("{}: cannot open", path));
  gzbuffer(gz, 1 << 20);
  inflated_.reserve(expected_size(path) + simdjson::SIMDJSON_PADDING);
  char buf[1 << 16];
  int n;
  while ((n = gzread(gz, buf, sizeof buf)) > 0) inflated_.append(buf, n);
  int err = Z_OK;
  const char* message = gzerror(gz, &err);
  const int64_t offset = static_cast<int64_t>(inflated_.size());
  const std::string why = message == nullptr ? "" : message;
  gzclose(gz);
  if (n >= 0 && (err == Z_OK || err == Z_STREAM_END)) return;
  // zlib says Z_BUF_ERROR when the compressed stream stops before its end: a cut file, whose
  // real offset is its size (the bytes of JSON inflated so far say how much survived).
  if (err == Z_BUF_ERROR)
    throw std::invalid_argument(fmt::format("{}: truncated at byte {} (the gzip stream ends early, after {} bytes of JSON)",
                                            path, file_bytes, offset));
  throw std::invalid_argument(fmt::format("{}: corrupt gzip data after {} bytes ({})", path, offset, why));
}

// B/E pairs become X slices, so everything downstream sees one kind of slice. An E without
// its B, or a B never closed, is skipped with a warning.
void close_begin_end(Trace& t, const std::string& name) {
  std::map<std::pair<int64_t, int64_t>, std::vector<size_t>> open;
  std::vector<char> drop(t.events.size(), 0);
  auto skip = [&](size_t i, const char* why) {
    drop[i] = 1;
    ++t.skipped;
    if (t.warnings.size() < 5) t.warnings.push_back(fmt::format("{}: event '{}' skipped: {}", name, t.name(t.events[i]), why));
  };
  for (size_t i = 0; i < t.events.size(); ++i) {
    Event& e = t.events[i];
    if (e.phase == 'B') open[{e.pid, e.tid}].push_back(i);
    if (e.phase != 'E') continue;
    auto& stack = open[{e.pid, e.tid}];
    if (stack.empty()) {
      skip(i, "an end (E) without a begin (B)");
      continue;
    }
    Event& begin = t.events[stack.back()];
    stack.pop_back();
    begin.phase = 'X';
    begin.dur = std::max(0.0, e.ts - begin.ts);
    drop[i] = 1;
  }
  for (auto& [thread, stack] : open)
    for (size_t i : stack) skip(i, "a begin (B) that never ends");
  size_t kept = 0;
  for (size_t i = 0; i < t.events.size(); ++i)
    if (!drop[i]) t.events[kept++] = t.events[i];
  t.events.resize(kept);
}

// chunk_bytes 0: in one piece. One piece needs simdjson's padding, so it parses a copy.
Trace parse_bytes(std::string_view json, const std::string& name, size_t chunk_bytes, const Copy& copy) {
  Trace trace;
  TopLevel top;
  bool begin_end = false;
  if (chunk_bytes == 0 || !parse_in_chunks(json, name, chunk_bytes, copy, trace, top, begin_end)) {
    const std::string bytes = padded(json);
    Document doc{bytes, name};
    trace = parse_document(doc);
    top = doc.top;
    begin_end = std::any_of(trace.events.begin(), trace.events.end(), is_begin_end);
  }
  if (begin_end) close_begin_end(trace, name);
  trace.dialect = detect(trace, top.opfuse);
  trace.rank = top.rank;
  trace.memory_before = top.memory_before;
  trace.plain_step_us = top.plain_step_us;
  return trace;
}

size_t chunk_bytes_for(size_t file_bytes) { return file_bytes < kParallelBytes ? 0 : kChunkBytes; }

}  // namespace

const char* dialect_name(Dialect d) {
  switch (d) {
    case Dialect::kineto: return "PyTorch Kineto";
    case Dialect::kineto_legacy_1_8: return "PyTorch Kineto (torch 1.8-1.9 layout)";
    case Dialect::legacy_profiler: return "PyTorch legacy profiler";
    case Dialect::opfuse: return "opfuse profiler";
    case Dialect::ascend: return "Ascend PyTorch profiler (trace_view.json)";
    case Dialect::unknown: break;
  }
  return "Chrome trace (unrecognised producer)";
}

namespace {

// Trace strings are short (op names, dims): a word at a time, with no call into libstdc++.
uint64_t hash_of(std::string_view s) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n, w = 0;
  for (; n >= 8; p += 8, n -= 8) {
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  if (n >= 4) {
    uint32_t a, b;
    std::memcpy(&a, p, 4), std::memcpy(&b, p + n - 4, 4);
    w = uint64_t{a} << 32 | b;
  } else if (n > 0) {
    w = uint64_t{p[0]} << 16 | uint64_t{p[n / 2]} << 8 | p[n - 1];
  } else {
    return h;
  }
  h = (h ^ w) * 0x94D049BB133111EBull;
  return h ^ (h >> 29);
}

}  // namespace

Strings::Strings() : slots_(64, 0) { intern(""); }

// A slot holds the string's index + 1 in its low half and its hash's top half above it, so a
// probe compares strings only when the hashes agree.
uint32_t Strings::intern(std::string_view s) {
  const uint64_t h = hash_of(s);
  const uint64_t tag = h >> 32 << 32;
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const uint64_t slot = slots_[i];
    if (slot == 0) {
      const auto id = static_cast<uint32_t>(strings_.size());
      strings_.emplace_back(s);
      slots_[i] = tag | (id + 1);
      if (strings_.size() * 2 > slots_.size()) grow();
      return id;
    }
    const auto id = static_cast<uint32_t>(slot) - 1;
    if ((slot & ~uint64_t{0xFFFFFFFF}) == tag && strings_[id] == s) return id;
  }
}

void Strings::grow() {
  std::vector<uint64_t> old(slots_.size() * 2, 0);
  old.swap(slots_);
  const size_t mask = slots_.size() - 1;
  for (uint64_t slot : old) {
    if (slot == 0) continue;
    size_t i = hash_of(strings_[static_cast<uint32_t>(slot) - 1]) & mask;
    while (slots_[i] != 0) i = (i + 1) & mask;
    slots_[i] = slot;
  }
}

Trace parse_trace(std::string_view json, const std::string& name) {
  return parse_bytes(json, name, chunk_bytes_for(json.size()), nullptr);
}

Trace read_trace(const std::string& path) {
  const Source source(path);
  return parse_bytes(source.bytes(), path, chunk_bytes_for(source.bytes().size()),
                     [&source](size_t begin, size_t n, char* to) { return source.copy(begin, n, to); });
}

Trace detail::parse_trace_chunked(std::string_view json, const std::string& name, size_t chunk_bytes) {
  return parse_bytes(json, name, std::max<size_t>(chunk_bytes, 1), nullptr);
}

}  // namespace opfuse::trace
