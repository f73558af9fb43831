// The trace reader on real traces from other projects (tests/data/traces, with their licences),
// on hand-written edge cases, and on thousands of corrupted inputs.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "opfuse/trace.h"
#include "trace/chunked.h"
#include "trace_diff.h"

namespace opfuse::trace {
namespace {

const std::string kData = OPFUSE_TEST_DATA "/traces/";
const std::string kFuzz = OPFUSE_TEST_DATA "/fuzz/";

size_t count_phase(const Trace& t, char phase) {
  size_t n = 0;
  for (const Event& e : t.events) n += e.phase == phase;
  return n;
}

size_t count_named(const Trace& t, const std::string& name) {
  size_t n = 0;
  for (const Event& e : t.events) n += t.name(e) == name;
  return n;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Reader, ReadsEveryDialectOfTheSampleTraces) {
  struct Case { const char* file; Dialect dialect; size_t events, complete; };
  for (const Case& c : std::vector<Case>{{"ascend_style_sample.json", Dialect::ascend, 334, 202},
                                         {"kineto_backward_thread.json", Dialect::kineto, 7, 7},
                                         {"kineto_compare_base.json.gz", Dialect::kineto, 33, 33},
                                         {"kineto_compare_test.json.gz", Dialect::kineto, 34, 34},
                                         {"kineto_cpu_only.json.gz", Dialect::kineto, 18, 16},
                                         {"kineto_rocm_minitoy.json.gz", Dialect::kineto, 160, 113}}) {
    const Trace t = read_trace(kData + c.file);
    EXPECT_EQ(t.dialect, c.dialect) << c.file;
    EXPECT_EQ(t.events.size(), c.events) << c.file;
    EXPECT_EQ(count_phase(t, 'X'), c.complete) << c.file;
  }
}

TEST(Reader, KeepsSequenceNumbersAndExternalIds) {
  const Trace t = read_trace(kData + "kineto_backward_thread.json");
  int found = 0;
  for (const Event& e : t.events) {
    if (t.name(e) != "AddmmBackward0") continue;
    ++found;
    EXPECT_EQ(e.sequence_nr, 714649);
    EXPECT_EQ(e.external_id, 67243);
    EXPECT_EQ(e.tid, 24922);
  }
  EXPECT_EQ(found, 1);
}

TEST(Reader, AscendDecimalStringTimestampsKeepTheirFractions) {
  const Trace t = read_trace(kData + "ascend_style_sample.json");
  EXPECT_EQ(t.process_names.size() >= 3, true);
  std::vector<double> ts;
  for (const Event& e : t.events)
    if (e.phase == 'X') ts.push_back(e.ts);
  ASSERT_GE(ts.size(), 2u);
  EXPECT_DOUBLE_EQ(ts[0], 0.0);    // "1704161511420000.000", the origin
  EXPECT_DOUBLE_EQ(ts[1], 12.0);   // "1704161511420012.000"
  bool quarter = false;            // "…420043.750" → 43.75 exactly, not rounded by a 1.7e15 double
  for (double v : ts) quarter |= v == 43.75;
  EXPECT_TRUE(quarter);
  EXPECT_EQ(count_named(t, "aten::sigmoid"), 6u);
}

TEST(Reader, ArrayAndObjectFormsAndStringIds) {
  const std::string array = R"([{"ph":"X","name":"aten::mul","pid":"CPU functions","tid":"stream 7","ts":10.5,"dur":2,"args":{}},
                                {"ph":"X","name":"aten::add","pid":"CPU functions","tid":"stream 7","ts":13,"dur":1}])";
  const Trace a = parse_trace(array, "array.json");
  ASSERT_EQ(a.events.size(), 2u);
  EXPECT_EQ(a.dialect, Dialect::legacy_profiler);
  EXPECT_LT(a.events[0].tid, 0);
  EXPECT_EQ(a.strings[-1 - a.events[0].tid], "stream 7");
  EXPECT_DOUBLE_EQ(a.events[1].ts - a.events[0].ts, 2.5);

  const Trace o = parse_trace(R"({"displayTimeUnit":"ms","opfuse":{"model":"m"},"traceEvents":[
      {"ph":"M","name":"thread_name","pid":1,"tid":3,"args":{"name":"main"}},
      {"ph":"X","cat":"cpu_op","name":"opfuse::silu","pid":1,"tid":3,"ts":1,"dur":4,
       "args":{"Module Hierarchy":"_blocks.0._swish","Sequence number":7}}]})",
                              "object.json");
  EXPECT_EQ(o.dialect, Dialect::opfuse);
  ASSERT_EQ(o.events.size(), 1u);
  EXPECT_EQ(o.strings[o.events[0].module], "_blocks.0._swish");
  EXPECT_EQ(o.events[0].sequence_nr, 7);
  EXPECT_EQ(o.thread_names.at(3), "main");

  const Trace old = parse_trace(R"([{"ph":"X","cat":"Operator","name":"aten::conv2d","pid":1,"tid":"1","ts":1,"dur":1},
                                    {"ph":"X","cat":"Kernel","name":"k","pid":0,"tid":"stream 7","ts":2,"dur":1,
                                     "args":{"correlation":5,"external id":9}}])",
                                "old.json");
  EXPECT_EQ(old.dialect, Dialect::kineto_legacy_1_8);
  EXPECT_EQ(old.events[1].correlation, 5);
  EXPECT_EQ(old.events[1].external_id, 9);
}

// Kineto's "distributedInfo" names the process's rank, before or after the events, in one piece
// or in chunks; a trace without one (or with a rank no count can be) has rank -1.
TEST(Reader, TheRankOfADistributedJobsTrace) {
  std::string events;
  for (int i = 0; i < 40; ++i)
    events += fmt::format(R"({}{{"ph":"X","cat":"cpu_op","name":"aten::mul","pid":1,"tid":1,"ts":{},"dur":1}})", i ? "," : "", 2 * i);
  const std::string before = R"({"distributedInfo":{"backend":"gloo","rank":3,"world_size":8},"traceEvents":[)" + events + "]}";
  const std::string after = R"({"traceEvents":[)" + events + R"(],"distributedInfo":{"rank":5}})";
  EXPECT_EQ(parse_trace(before, "r3.json").rank, 3);
  EXPECT_EQ(detail::parse_trace_chunked(before, "r3.json", 200).rank, 3);
  EXPECT_EQ(parse_trace(after, "r5.json").rank, 5);
  EXPECT_EQ(detail::parse_trace_chunked(after, "r5.json", 200).rank, 5);
  EXPECT_GT(detail::parse_trace_chunked(after, "r5.json", 200).chunks, 2);
  EXPECT_EQ(parse_trace("[" + events + "]", "plain.json").rank, -1);
  EXPECT_EQ(parse_trace(R"({"distributedInfo":{"rank":"two"},"traceEvents":[)" + events + "]}", "odd.json").rank, -1);
  EXPECT_EQ(parse_trace(R"({"distributedInfo":[1],"traceEvents":[)" + events + "]}", "odd.json").rank, -1);
}

void expect_error_with_offset(const std::string& json, const std::string& what) {
  try {
    parse_trace(json, "bad.json");
    ADD_FAILURE() << what << ": no error";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("bad.json: ", 0), 0u) << message;
    EXPECT_NE(message.find("at byte "), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(Reader, MalformedInputIsAnErrorNamingFileAndOffset) {
  expect_error_with_offset("", "empty");
  expect_error_with_offset("{", "open brace");
  expect_error_with_offset(R"({"traceEvents": [{"ph":"X","name":"a","ts":1,"dur":1},)", "truncated");
  expect_error_with_offset(R"({"other": 1})", "no traceEvents");
  expect_error_with_offset(R"([1, 2])", "events that are not objects");
  expect_error_with_offset(R"([{"ph":"X","name":"a","ts":1,"dur":1}] [])", "trailing content");
  expect_error_with_offset("[{\"ph\":\"X\",\"name\":\"\xff\xfe\",\"ts\":1}]", "invalid UTF-8");
  expect_error_with_offset(std::string(3000, '[') + std::string(3000, ']'), "very deep nesting");
  EXPECT_THROW(read_trace(kData + "no_such_file.json"), std::invalid_argument);
}

// A file cut short is named as truncated at the byte where it stops, wherever the cut falls: in
// a string, between keys, after a comma. simdjson alone says "byte 0" for an unclosed string.
void expect_truncated(const std::string& path, int64_t at, const std::string& why) {
  try {
    read_trace(path);
    ADD_FAILURE() << path << ": no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind(fmt::format("{}: truncated at byte {} ({}", path, at, why), 0), 0u) << e.what();
  }
}

std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() / fmt::format("opfuse-reader-{}-{}", ::getpid(), name);
}

TEST(Reader, ACutFileIsTruncatedAtItsSize) {
  for (const char* file : {"kineto_backward_thread.json", "ascend_style_sample.json"}) {
    const std::string json = slurp(kData + file);
    const auto path = temp_file(file);
    for (size_t cut = json.size() / 8; cut < json.size(); cut += json.size() / 8 + 13) {
      SCOPED_TRACE(fmt::format("{} cut at {}", file, cut));
      std::ofstream(path, std::ios::binary) << json.substr(0, cut);
      expect_truncated(path.string(), static_cast<int64_t>(cut), "the file ends inside ");
    }
    std::filesystem::remove(path);
  }
}

// A cut .gz ends its compressed stream early: the offset is in the file as it is on disk. A whole
// .gz of a cut trace is truncated in its JSON.
TEST(Reader, ACutGzipFileIsTruncatedAtItsSize) {
  const std::string gz = slurp(kData + "kineto_rocm_minitoy.json.gz");
  const auto path = temp_file("cut.json.gz");
  std::ofstream(path, std::ios::binary) << gz.substr(0, gz.size() / 2);
  expect_truncated(path.string(), static_cast<int64_t>(gz.size() / 2), "the gzip stream ends early, after ");

  const std::string json = slurp(kData + "kineto_backward_thread.json");
  gzFile out = gzopen(path.c_str(), "wb");
  ASSERT_NE(out, nullptr);
  gzwrite(out, json.data(), static_cast<unsigned>(json.size() / 2));
  gzclose(out);
  expect_truncated(path.string(), static_cast<int64_t>(json.size() / 2), "the file ends inside ");
  std::filesystem::remove(path);
}

// One unusable event is skipped with a warning naming its byte offset; the rest are kept.
TEST(Reader, UnusableEventsAreSkippedWithAWarning) {
  const std::string json = R"([{"ph":"X","name":"ok","ts":1,"dur":1},
                                  {"ph":"X","name":"neg","ts":2,"dur":-5},
                                  {"ph":"X","name":"text","ts":"abc","dur":1},
                                  {"ph":"X","name":"nots","dur":1},
                                  {"ph":"X","name":"strdur","ts":3,"dur":"long"},
                                  {"ph":"X","name":"ok2","ts":4,"dur":"2.5"}])";
  const Trace t = parse_trace(json, "bad.json");
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_EQ(t.name(t.events[1]), "ok2");
  EXPECT_DOUBLE_EQ(t.events[1].dur, 2.5);
  EXPECT_EQ(t.skipped, 4);
  ASSERT_EQ(t.warnings.size(), 4u);
  EXPECT_NE(t.warnings[0].find("bad.json: event skipped: negative dur"), std::string::npos) << t.warnings[0];
  const size_t at = json.find(R"({"ph":"X","name":"neg")");
  EXPECT_NE(t.warnings[0].find(fmt::format("at byte {}", at)), std::string::npos) << t.warnings[0];
}

TEST(Reader, FlowEventsWithoutTsAreSkipped) {
  const Trace t = parse_trace(slurp(kFuzz + "flow_no_ts.json"), "flow.json");
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_EQ(t.events[1].phase, 'f');
  EXPECT_DOUBLE_EQ(t.events[1].ts, 2);
  EXPECT_EQ(t.skipped, 1);
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_NE(t.warnings[0].find("event skipped: no ts"), std::string::npos) << t.warnings[0];
}

// 1.5e3 is 1500, quoted or not; a fraction that is not all digits is a bad timestamp.
TEST(Reader, TimestampsWithExponents) {
  const Trace t = parse_trace(slurp(kFuzz + "exponent_ts.json"), "exp.json");
  ASSERT_EQ(t.events.size(), 3u);
  EXPECT_DOUBLE_EQ(t.events[1].ts, 1500);
  EXPECT_DOUBLE_EQ(t.events[2].ts, 1500);
  EXPECT_EQ(t.skipped, 1);
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_NE(t.warnings[0].find("bad timestamp '2.5x'"), std::string::npos) << t.warnings[0];
  EXPECT_EQ(parse_trace(R"([{"ph":"X","name":"a","ts":"7.5E2","dur":1}])", "e.json").origin_us, 750);
}

// Timestamps too far from the origin for int64 arithmetic are bad events (UBSan caught the
// overflow), not wrapped around.
TEST(Reader, TimestampsTooFarApartAreSkipped) {
  const Trace t = parse_trace(slurp(kFuzz + "ts_overflow.json"), "far.json");
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.name(t.events[0]), "a");
  EXPECT_EQ(t.skipped, 1);
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_NE(t.warnings[0].find("too far from the origin"), std::string::npos) << t.warnings[0];
}

// Chrome traces allow negative pids and tids; they are kept as their decimal text, as string ids
// are, so "-3" and -3 name one process.
TEST(Reader, NegativeIdsAreInternedAsText) {
  const Trace f = parse_trace(slurp(kFuzz + "negative_pid.json"), "neg.json");
  ASSERT_EQ(f.events.size(), 1u);
  ASSERT_LT(f.events[0].pid, 0);
  EXPECT_EQ(f.strings[-1 - f.events[0].pid], "-155555");
  const Trace t = parse_trace(R"([{"ph":"M","name":"process_name","pid":-3,"args":{"name":"gpu"}},
                                  {"ph":"X","name":"a","pid":-3,"tid":-7,"ts":1,"dur":1},
                                  {"ph":"X","name":"b","pid":"-3","tid":7,"ts":2,"dur":1}])",
                              "neg.json");
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_EQ(t.skipped, 0);
  EXPECT_EQ(t.events[0].pid, t.events[1].pid);
  EXPECT_EQ(t.strings[-1 - t.events[0].tid], "-7");
  EXPECT_EQ(t.events[1].tid, 7);
  EXPECT_EQ(t.process_names.at(t.events[0].pid), "gpu");
}

TEST(Reader, BeginEndPairsBecomeSlices) {
  const std::string json = R"([{"ph":"B","name":"outer","pid":1,"tid":1,"ts":0},
                               {"ph":"B","name":"inner","pid":1,"tid":1,"ts":2},
                               {"ph":"E","pid":1,"tid":1,"ts":5},
                               {"ph":"E","pid":1,"tid":1,"ts":9},
                               {"ph":"E","pid":1,"tid":1,"ts":10}])";
  // In one piece, and cut into chunks that part each B from its E.
  for (const Trace& t : {parse_trace(json, "be.json"), detail::parse_trace_chunked(json, "be.json", 60)}) {
    ASSERT_EQ(t.events.size(), 2u);
    EXPECT_EQ(t.name(t.events[0]), "outer");
    EXPECT_EQ(t.events[0].phase, 'X');
    EXPECT_DOUBLE_EQ(t.events[0].dur, 9);
    EXPECT_DOUBLE_EQ(t.events[1].dur, 3);
    EXPECT_EQ(t.skipped, 1);  // the E without a B
  }
  EXPECT_GT(detail::parse_trace_chunked(json, "be.json", 60).chunks, 1);
}

// A file big enough to be cut into chunks parses exactly as it does in one piece: same events,
// same strings, timestamps relative to the file's first one. With "},{" inside strings the cuts
// are wrong, and the reader must notice and parse the file in one piece instead.
void expect_chunked_parse(const std::string& note, bool chunked) {
  SCOPED_TRACE(note);
  std::string json = R"({"opfuse": {"x": "},{"}, "traceEvents": [)";
  const int n = 120000;
  for (int i = 0; i < n; ++i)
    json += fmt::format(R"({}{{"ph":"X","cat":"cpu_op","name":"op{}","pid":7,"tid":"t{}","ts":"1704161511{:06}.{:03}","dur":1.5,)"
                        R"("args":{{"Input Dims":[[{},3],[]],"Sequence number":{},"note":"{}"}}}})",
                        i ? ",\n" : "", i % 97, i % 3, i * 3, i % 1000, i % 5, i, note);
  json += "]}";
  ASSERT_GT(json.size(), size_t{16} << 20);
  const Trace t = parse_trace(json, "big.json");
  ASSERT_EQ(t.events.size(), static_cast<size_t>(n));
  if (chunked) EXPECT_GT(t.chunks, 2);
  else EXPECT_EQ(t.chunks, 1);
  EXPECT_EQ(t.dialect, Dialect::opfuse);
  for (int i : {0, 1, n / 2, n - 1}) {
    const Event& e = t.events[i];
    EXPECT_EQ(t.name(e), fmt::format("op{}", i % 97));
    EXPECT_EQ(t.strings[-1 - e.tid], fmt::format("t{}", i % 3));
    EXPECT_NEAR(e.ts, i * 3.0 + (i % 1000) / 1000.0, 1e-6);
    EXPECT_EQ(t.strings[e.dims], fmt::format("{},3;", i % 5));
    EXPECT_EQ(e.sequence_nr, i);
  }
  // From a file the bytes are mapped and handed back chunk by chunk: still the same trace.
  const auto path = std::filesystem::temp_directory_path() / fmt::format("opfuse-reader-{}.json", ::getpid());
  std::ofstream(path, std::ios::binary) << json;
  const Trace mapped = read_trace(path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(mapped.chunks, t.chunks);
  EXPECT_EQ(trace_difference(t, mapped), "");
}

TEST(Reader, ChunkedParseMatchesTheWholeFile) {
  expect_chunked_parse("plain", true);
  expect_chunked_parse("},{", false);
}

// The chunked path on a small input (chunks of a few bytes: one event each) reads exactly what
// the one-piece parse reads, or is rejected as it is. Returns the chunked parse.
Trace expect_chunked_like_whole(const std::string& json, bool chunked, size_t chunk_bytes = 1) {
  SCOPED_TRACE(json);
  const Trace whole = parse_trace(json, "small.json");
  Trace pieces = detail::parse_trace_chunked(json, "small.json", chunk_bytes);
  EXPECT_EQ(whole.chunks, 1);
  if (chunked) EXPECT_GT(pieces.chunks, 1);
  else EXPECT_EQ(pieces.chunks, 1);
  EXPECT_EQ(trace_difference(whole, pieces), "");
  return pieces;
}

void expect_both_reject(const std::string& json) {
  SCOPED_TRACE(json);
  std::string whole, pieces;
  try {
    parse_trace(json, "small.json");
  } catch (const std::invalid_argument& e) {
    whole = e.what();
  }
  try {
    detail::parse_trace_chunked(json, "small.json", 1);
  } catch (const std::invalid_argument& e) {
    pieces = e.what();
  }
  EXPECT_NE(whole, "");
  EXPECT_EQ(pieces, whole);
}

TEST(Reader, ChunkedPathRejectsWhatTheWholeParseRejects) {
  expect_both_reject(slurp(kFuzz + "trailing_garbage.json"));  // [...]}
  expect_both_reject(slurp(kFuzz + "trailing_comma.json"));    // [{…},{…},]
  expect_both_reject(R"({"traceEvents":[{"ph":"X","name":"a","ts":1},{"ph":"X","name":"b","ts":2},]})");
  expect_chunked_like_whole(R"([{"ph":"X","name":"a","ts":1},{"ph":"X","name":"b","ts":2}] )", true);
}

// A chunk that begins with an outlier timestamp (0 among 1.7e15s) measures from the file's
// origin like every other chunk, so the next event keeps its fraction.
TEST(Reader, ChunkedPathKeepsTimestampsAfterAnOutlier) {
  const Trace t = expect_chunked_like_whole(slurp(kFuzz + "outlier_ts.json"), true, 50);
  EXPECT_EQ(t.chunks, 2);  // [a] [outlier, b]
  ASSERT_EQ(t.events.size(), 3u);
  EXPECT_EQ(t.origin_us, 1704161511420000);
  EXPECT_DOUBLE_EQ(t.events[1].ts, -1704161511420000.0);
  EXPECT_DOUBLE_EQ(t.events[2].ts, 306.491);
  // The origin is the first timestamp read, even one of a metadata or skipped event.
  const Trace m = expect_chunked_like_whole(R"([{"ph":"M","name":"process_name","pid":1,"ts":5,"args":{"name":"p"}},
      {"ph":"X","name":"a","ts":9,"dur":-1},{"ph":"X","name":"b","ts":100,"dur":1}])", true);
  EXPECT_EQ(m.origin_us, 5);
  ASSERT_EQ(m.events.size(), 1u);
  EXPECT_DOUBLE_EQ(m.events[0].ts, 95);
  const Trace late = expect_chunked_like_whole(R"([{"ph":"X","name":"a"},{"ph":"X","name":"b"},
      {"ph":"X","name":"c","ts":7,"dur":1},{"ph":"X","name":"d","ts":9.5}])", true);
  EXPECT_EQ(late.origin_us, 7);
  ASSERT_EQ(late.events.size(), 2u);
  EXPECT_DOUBLE_EQ(late.events[1].ts, 2.5);
  expect_chunked_like_whole(slurp(kFuzz + "ts_overflow.json"), true);
  expect_chunked_like_whole(slurp(kFuzz + "exponent_ts.json"), true);
}

TEST(Reader, ChunkedPathMergesStringIds) {
  const Trace t = expect_chunked_like_whole(slurp(kFuzz + "string_flow_ids.json"), true);
  ASSERT_EQ(t.events.size(), 3u);
  ASSERT_LT(t.events[2].flow_id, 0);
  EXPECT_EQ(t.strings[-1 - t.events[2].flow_id], "x");
  EXPECT_EQ(t.events[1].flow_id, t.events[2].flow_id);
  expect_chunked_like_whole(R"([{"ph":"X","name":"a","pid":"p","tid":-2,"ts":1},{"ph":"X","name":"b","pid":-2,"tid":"p","ts":2}])",
                            true);
}

// What follows the event array: more events are read in one piece; "opfuse" metadata is seen.
TEST(Reader, ChunkedPathReadsWhatFollowsTheEvents) {
  const Trace two = expect_chunked_like_whole(slurp(kFuzz + "two_arrays.json"), false);
  EXPECT_EQ(two.events.size(), 3u);
  const Trace meta = expect_chunked_like_whole(slurp(kFuzz + "opfuse_after_events.json"), true);
  EXPECT_EQ(meta.dialect, Dialect::opfuse);
  const Trace escaped = expect_chunked_like_whole(
      R"({"trace\u0045vents":[{"ph":"X","name":"a","ts":1}],"traceEvents":[{"ph":"X","name":"b","ts":2},{"ph":"X","name":"c","ts":3}]})",
      false);
  EXPECT_EQ(escaped.events.size(), 3u);
}

// Every input kept from fuzzing reads alike whole and in chunks of several sizes.
TEST(Reader, FuzzInputsReadAlikeWholeAndChunked) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kFuzz)) {
    SCOPED_TRACE(entry.path().string());
    const std::string json = slurp(entry.path().string());
    for (size_t chunk_bytes : {1, 7, 64}) {
      std::string whole_error, chunked_error;
      Trace whole, pieces;
      try {
        whole = parse_trace(json, "fuzz.json");
      } catch (const std::invalid_argument& e) {
        whole_error = e.what();
      }
      try {
        pieces = detail::parse_trace_chunked(json, "fuzz.json", chunk_bytes);
      } catch (const std::invalid_argument& e) {
        chunked_error = e.what();
      }
      EXPECT_EQ(whole_error, chunked_error);
      EXPECT_EQ(trace_difference(whole, pieces), "") << chunk_bytes;
    }
    ++n;
  }
  EXPECT_GE(n, 10);
}

// Corrupted copies of a real trace: every one either parses or throws invalid_argument —
// never a crash, a hang or another exception type.
TEST(Reader, FuzzedInputNeverCrashes) {
  for (const char* file : {"kineto_backward_thread.json", "ascend_style_sample.json"}) {
  SCOPED_TRACE(file);
  const std::string original = slurp(kData + file);
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int parsed = 0, rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string s = original;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      const size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0: s[at] = static_cast<char>(rng()); break;
        case 1: s.erase(at, 1 + rng() % 16); break;
        case 2: s.resize(at); break;
      }
      if (s.empty()) s = "[";
    }
    try {
      parse_trace(s, "fuzz.json");
      ++parsed;
    } catch (const std::invalid_argument&) {
      ++rejected;
    }
  }
  EXPECT_EQ(parsed + rejected, 3000);
  EXPECT_GT(rejected, 1000);
  }
}

}  // namespace
}  // namespace opfuse::trace
