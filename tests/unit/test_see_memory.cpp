// What headroom shows outside its logs: TensorBoard event files (CRC-32C, TFRecord framing, the Event and
// Summary messages), memory timelines, memory_viz snapshots, the allocator's breakdown at its peak, the run
// report. The real readers check the same files end to end (tests/py/see_memory.sh); these pin the pieces.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/io/tfevents.h"
#include "core/memory/caching_allocator.h"
#include "core/memory/memviz.h"
#include "core/memory/replay.h"
#include "core/memory/timeline.h"
#include "train/config.h"
#include "train/report.h"

using namespace hr;
using namespace hr::core;
using json = nlohmann::json;

namespace {

using Block = CachingAllocator::Block;

// A minimal protobuf reader for the test: fields of one message as (number, wire type, payload).
struct Field {
  int number, wire;
  uint64_t varint = 0;
  std::string bytes;  // length-delimited, or the 4/8 fixed bytes
};
std::vector<Field> fields(const std::string& m) {
  std::vector<Field> out;
  std::size_t i = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const uint8_t b = uint8_t(m.at(i++));
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (i < m.size()) {
    const uint64_t key = varint();
    Field f{int(key >> 3), int(key & 7), 0, {}};
    if (f.wire == 0)
      f.varint = varint();
    else if (f.wire == 1)
      f.bytes = m.substr(i, 8), i += 8;
    else if (f.wire == 5)
      f.bytes = m.substr(i, 4), i += 4;
    else if (f.wire == 2) {
      const uint64_t n = varint();
      f.bytes = m.substr(i, n), i += n;
    } else
      ADD_FAILURE() << "wire type " << f.wire;
    out.push_back(f);
  }
  return out;
}

std::vector<std::string> records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  for (std::size_t i = 0; i < all.size();) {
    uint64_t n;
    uint32_t len_crc, data_crc;
    std::memcpy(&n, all.data() + i, 8);
    std::memcpy(&len_crc, all.data() + i + 8, 4);
    EXPECT_EQ(len_crc, masked_crc32c(all.data() + i, 8));
    const std::string data = all.substr(i + 12, n);
    std::memcpy(&data_crc, all.data() + i + 12 + n, 4);
    EXPECT_EQ(data_crc, masked_crc32c(data.data(), data.size()));
    out.push_back(data);
    i += 16 + n;
  }
  return out;
}

}  // namespace

TEST(TfEvents, Crc32cIsCastagnolis) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the standard check value
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720's test vector
}

TEST(TfEvents, AFileIsAVersionEventThenScalarEventsInTfRecords) {
  const std::string dir = testing::TempDir() + "/tfevents";
  std::filesystem::remove_all(dir);
  std::string path;
  {
    EventWriter w(dir);
    path = w.path();
    w.scalars(7, {{"train/loss", 1.5f}, {"memory/peak_allocated", 123456789.f}});
  }
  EXPECT_NE(path.find("/events.out.tfevents."), std::string::npos);
  const auto recs = records(path);
  ASSERT_EQ(recs.size(), 2u);
  const auto header = fields(recs[0]);
  ASSERT_EQ(header.size(), 2u);
  EXPECT_EQ(header[0].number, 1);  // wall_time
  EXPECT_EQ(header[1].number, 3);
  EXPECT_EQ(header[1].bytes, "brain.Event:2");
  const auto event = fields(recs[1]);
  ASSERT_EQ(event.size(), 3u);
  EXPECT_EQ(event[1].number, 2);
  EXPECT_EQ(event[1].varint, 7u);
  ASSERT_EQ(event[2].number, 5);  // summary
  const auto values = fields(event[2].bytes);
  ASSERT_EQ(values.size(), 2u);
  std::vector<std::pair<std::string, float>> got;
  for (const Field& v : values) {
    const auto vf = fields(v.bytes);
    ASSERT_EQ(vf.size(), 2u);
    ASSERT_EQ(vf[1].wire, 5);
    float x;
    std::memcpy(&x, vf[1].bytes.data(), 4);
    got.emplace_back(vf[0].bytes, x);
  }
  EXPECT_EQ(got[0], std::make_pair(std::string("train/loss"), 1.5f));
  EXPECT_EQ(got[1], std::make_pair(std::string("memory/peak_allocated"), 123456789.f));
}

// A run that starts at step 251 (resumed) says so: Event{wall_time, step 251, session_log {status: START}}, the
// bytes PyTorch's SummaryWriter(purge_step=251) writes (tensorboard's event_pb2 gives 10 fb 01 3a 02 08 01 after
// the wall time).
TEST(TfEvents, ASessionStartEventCarriesItsStep) {
  const std::string e = encode_session_start_event(1.5, 251);
  EXPECT_EQ(e.substr(9), std::string("\x10\xfb\x01\x3a\x02\x08\x01", 7));
  const auto f = fields(e);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[1].varint, 251u);
  EXPECT_EQ(f[2].number, 7);  // session_log
  const auto log = fields(f[2].bytes);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].number, 1);
  EXPECT_EQ(log[0].varint, 1u);  // START
}

TEST(Allocator, KnowsEachCategorysBytesAtItsPeak) {
  CachingAllocator a(make_meta_allocator(0), "meta");
  Block *p, *x, *y;
  {
    MemoryScope s(Category::Params);
    p = a.allocate(4096);
  }
  x = a.allocate(8192);  // activations
  {
    MemoryScope s(Category::Workspace);
    y = a.allocate(2048);
  }
  a.free(y);
  a.free(x);
  {
    MemoryScope s(Category::Grads);
    y = a.allocate(10240);  // the same total as the peak, later: the peak stays the first one
  }
  MemoryStats st = a.stats();
  EXPECT_EQ(st.allocated_bytes.peak, 4096 + 8192 + 2048);
  EXPECT_EQ(st.at_peak[std::size_t(Category::Params)], 4096);
  EXPECT_EQ(st.at_peak[std::size_t(Category::Activations)], 8192);
  EXPECT_EQ(st.at_peak[std::size_t(Category::Workspace)], 2048);
  EXPECT_EQ(st.at_peak[std::size_t(Category::Grads)], 0);
  a.reset_peak_stats();
  st = a.stats();
  EXPECT_EQ(st.at_peak[std::size_t(Category::Grads)], 10240);
  EXPECT_EQ(st.at_peak[std::size_t(Category::Activations)], 0);
  a.free(y);
  a.free(p);
}

TEST(Timeline, CountersFollowTheAllocatorAndSlicesNest) {
  CachingAllocator a(make_meta_allocator(0), "meta");
  Timeline t(Timeline::Clock::Events);
  const int track = t.add_allocator("device", a.stats());
  a.set_trace([&](const TraceEvent& e) { t.allocator_event(track, e); });
  set_span_timeline(&t);
  Block *x, *y;
  {
    TraceSpan outer("forward", "forward layer ", 0);
    x = a.allocate(3_MiB);
    TraceSpan inner(TraceSpan::When{true}, "recompute", "recompute");
    y = a.allocate(1000);
    TraceSpan never(TraceSpan::When{false}, "recompute", "not recorded");
  }
  a.free(y);
  trace_begin("optimizer", "left open");  // an error cut the step short: the slice is closed at the end
  set_span_timeline(nullptr);
  a.set_trace({});
  EXPECT_FALSE(tracing());
  const json j = json::parse(t.chrome_json(3, "rank 3"));
  int depth = 0, max_depth = 0;
  double last = -1;
  std::map<std::string, int64_t> counters;
  std::vector<std::string> names, instants;
  for (const json& e : j["traceEvents"]) {
    for (const char* k : {"ph", "ts", "pid", "tid"}) ASSERT_TRUE(e.contains(k)) << e.dump();
    EXPECT_EQ(e["pid"], 3);
    const std::string ph = e["ph"];
    if (ph == "M") continue;
    EXPECT_GE(e["ts"].get<double>(), last);
    last = e["ts"].get<double>();
    if (ph == "B") names.push_back(e["name"]), max_depth = std::max(max_depth, ++depth);
    if (ph == "E") --depth;
    if (ph == "C") counters[e["name"]] = e["args"]["bytes"];
    if (ph == "i") instants.push_back(e["name"]);
  }
  EXPECT_EQ(depth, 0);
  EXPECT_EQ(max_depth, 2);
  EXPECT_EQ(names, (std::vector<std::string>{"forward layer 0", "recompute", "left open"}));
  EXPECT_EQ(counters["device allocated"], int64_t(3_MiB));  // y freed, x still allocated
  EXPECT_EQ(counters["device activations"], int64_t(3_MiB));
  EXPECT_EQ(counters["device reserved"], a.stats().reserved_bytes.current);
  EXPECT_EQ(instants.size(), 2u);  // the two segments
  a.free(x);
}

TEST(Timeline, ARetryIsAnInstantBeforeTheCacheItReleases) {
  CachingAllocator a(make_meta_allocator(30_MiB), "meta");
  Timeline t(Timeline::Clock::Events);
  const int track = t.add_allocator("device", a.stats());
  a.set_trace([&](const TraceEvent& e) { t.allocator_event(track, e); });
  a.free(a.allocate(3_MiB));        // a 20 MiB segment, cached
  Block* big = a.allocate(22_MiB);  // no room beside it: the cache goes, the request is retried and fits
  a.set_trace({});
  const json trace = json::parse(t.chrome_json(0, "p"));
  std::vector<std::string> instants;
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == "i") instants.push_back(e["name"]);
  ASSERT_EQ(instants.size(), 4u);
  EXPECT_EQ(instants[0], "device segment allocated 20.00 MiB");
  EXPECT_NE(instants[1].find("no segment for 22.00 MiB"), std::string::npos) << instants[1];
  EXPECT_NE(instants[1].find("retried"), std::string::npos) << instants[1];
  EXPECT_EQ(instants[2], "device cached segment freed 20.00 MiB");
  EXPECT_EQ(instants[3], "device segment allocated 22.00 MiB");
  EXPECT_EQ(a.stats().num_alloc_retries, 1);
  a.free(big);
}

TEST(Memviz, TheStateAtAStretchsPeakAndItsHistory) {
  CachingAllocator a(make_meta_allocator(0), "meta");
  Block* kept;
  {
    MemoryScope s(Category::Params, "weights");
    kept = a.allocate(1_MiB + 512);
  }
  const AllocatorSnapshot start = a.snapshot();
  RequestTrace trace;
  a.set_trace([&](const TraceEvent& e) { trace.record(e); });
  Block *x, *y, *z;
  {
    MemoryScope s(Category::Activations, "layer.0");
    x = a.allocate(4_MiB);
    y = a.allocate(2_MiB);
  }
  a.free(x);
  {
    MemoryScope s(Category::Workspace, "layer.1");
    z = a.allocate(1_MiB);
  }
  a.free(y);
  a.free(z);
  a.set_trace({});
  const PeakState p = state_at_peak(start, trace);
  EXPECT_EQ(p.peak_allocated, int64_t(round_size(1_MiB + 512) + 4_MiB + 2_MiB));
  std::vector<std::string> owners;
  for (const auto& seg : p.state.segments)
    for (const auto& b : seg.blocks)
      if (b.allocated) owners.push_back(b.owner);
  std::sort(owners.begin(), owners.end());
  EXPECT_EQ(owners, (std::vector<std::string>{"layer.0", "layer.0", "weights"}));
  std::vector<std::string> actions;
  for (const MemvizAction& m : p.history) actions.push_back(m.action);
  // The replay starts from the cached segment the first request came from: no segment is allocated before
  // the two allocations that make the peak.
  EXPECT_EQ(std::count(actions.begin(), actions.end(), std::string("alloc")), 2);
  EXPECT_EQ(p.history.back().owner, "layer.0");
  const std::string pickle = memviz_snapshot(p.state, p.history, "cpu");
  EXPECT_EQ(pickle.substr(0, 2), std::string("\x80\x02"));
  EXPECT_EQ(pickle.back(), '.');
  for (const char* s : {"segments", "device_traces", "active_allocated", "requested_size", "history", "layer.0"})
    EXPECT_NE(pickle.find(s), std::string::npos) << s;
  a.free(kept);
}

TEST(Config, SeeMemoryKeys) {
  train::RunConfig c = train::load_config_text("", "test",
                                               {"log.report_to=[tensorboard]", "memory.trace_steps=[3, 5]",
                                                "memory.trace_clock=events", "memory.snapshot_on_oom=true"});
  EXPECT_TRUE(c.tensorboard);
  EXPECT_EQ(c.trace_steps, (std::vector<int64_t>{3, 5}));
  EXPECT_TRUE(c.trace_event_clock);
  EXPECT_TRUE(c.snapshot_on_oom);
  EXPECT_FALSE(train::load_config_text("", "test", {}).tensorboard);
  EXPECT_EQ(train::load_config_text("", "test", {"memory.trace_steps=4"}).trace_steps, std::vector<int64_t>{4});
  auto error = [](const std::string& set) {
    try {
      train::load_config_text("", "test", {set});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error("log.report_to=wandb").find("log.report_to"), std::string::npos);
  EXPECT_NE(error("memory.trace_steps=[0]").find("memory.trace_steps"), std::string::npos);
  EXPECT_NE(error("memory.trace_clock=cpu").find("one of: time, events"), std::string::npos);
}

TEST(Report, NamesWhatIsMissingAndDrawsEverySeries) {
  const std::string d = testing::TempDir() + "/report";
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  try {
    train::run_report_html(d);
    ADD_FAILURE() << "no error for a directory without logs";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory.jsonl"), std::string::npos) << e.what();
  }
  {
    std::ofstream m(d + "/memory.rank0.jsonl"), m1(d + "/memory.rank1.jsonl");
    for (int s = 1; s <= 3; ++s) {
      json l = {{"step", s},
                {"loss", 3.0 / s},
                {"tokens_per_s", 100},
                {"step_s", 0.5},
                {"comm_exposed_s", 0.01 * s},
                {"peak_allocated", 1000 * s},
                {"predicted_peak", 1000 * s},
                {"peak_reserved", 4096},
                {"predicted_reserved", 4096},
                {"planned_peak", 5000},
                {"host_rss", 1 << 20},
                {"host", {{"allocated", 10}}},
                {"at_peak", {{"params", 500}, {"activations", 1000 * s - 500}}},
                {"warnings", s == 3 ? json::array({"[memory] warning: something grew"}) : json::array()}};
      m << l.dump() << "\n";
      m1 << l.dump() << "\n";
    }
    // A resumed run logs step 3 again (the later line counts) after a run killed mid-line.
    m << "{\"step\": 4, \"loss\n" << json{{"step", 3}, {"loss", 0.25}, {"peak_allocated", 3000}}.dump() << "\n";
    std::ofstream(d + "/eval.jsonl")
        << R"({"step": 2, "loss": 1.0, "accuracy": 0.5, "accuracy_by_type": {"color": 0.75}})"
        << "\n";
  }
  const std::string html = train::run_report_html(d);
  for (const char* s :
       {"data-series=\"params\"", "data-series=\"activations\"", "data-series=\"measured peak allocated\"",
        "data-series=\"predicted peak allocated\"", "data-series=\"rank 1 peak allocated\"",
        "data-series=\"eval accuracy\"", "data-series=\"accuracy color\"", "data-series=\"tokens/s\"",
        "data-series=\"step time\"", "data-series=\"rank 1 exposed communication\"", "exactly where its dry run said",
        "document.body.dataset.ready", "3 steps logged", "1 log lines that are not JSON skipped"})
    EXPECT_NE(html.find(s), std::string::npos) << s;
  // Rank 0's first line of step 3 was replaced by the resumed run's; rank 1's warning stays.
  EXPECT_EQ(html.find("rank 0, step 3: [memory] warning"), std::string::npos);
  EXPECT_NE(html.find("rank 1, step 3: [memory] warning: something grew"), std::string::npos);
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  std::ofstream(d + "/eval.jsonl") << "{\"loss\": 1}\n";
  try {
    train::run_report_html(d);
    ADD_FAILURE() << "no error for an eval.jsonl line without a step";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("eval.jsonl: line 1 has no integer \"step\""), std::string::npos) << e.what();
  }
}
