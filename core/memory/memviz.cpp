// memory_viz snapshots: a pickle writer for JSON-shaped values and the snapshot's layout.
#include "core/memory/memviz.h"

#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/memory/raw_allocator.h"

namespace hr::core {

namespace {

using nlohmann::json;

// Pickle protocol 2 for the values JSON can hold (what the snapshot is made of): dicts with string keys,
// lists, strings, integers, floats, booleans and None. Written by hand: a few opcodes, and no library for it
// in the packages this project uses.
class Pickler {
 public:
  std::string dump(const json& v) {
    out_ = "\x80\x02";
    value(v);
    out_ += '.';
    return std::move(out_);
  }

 private:
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_ += char(uint8_t(v >> (8 * i)));
  }
  void text(const std::string& s) {
    out_ += 'X';  // BINUNICODE: 4-byte length, UTF-8
    u32(uint32_t(s.size()));
    out_ += s;
  }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';  // BININT: 4-byte signed
      u32(uint32_t(int32_t(v)));
      return;
    }
    out_ += '\x8a';  // LONG1: 8 bytes, little-endian two's complement
    out_ += char(8);
    for (int i = 0; i < 8; ++i) out_ += char(uint8_t(uint64_t(v) >> (8 * i)));
  }
  void value(const json& v) {
    switch (v.type()) {
      case json::value_t::null:
        out_ += 'N';
        break;
      case json::value_t::boolean:
        out_ += v.get<bool>() ? '\x88' : '\x89';
        break;
      case json::value_t::number_integer:
        integer(v.get<int64_t>());
        break;
      case json::value_t::number_unsigned:
        unsigned_integer(v.get<uint64_t>());
        break;
      case json::value_t::number_float:
        real(v.get<double>());
        break;
      case json::value_t::string:
        text(v.get<std::string>());
        break;
      case json::value_t::array:
        list(v);
        break;
      case json::value_t::object:
        dict(v);
        break;
      default:
        HR_ASSERT(false, "a value pickle cannot hold");
    }
  }
  void unsigned_integer(uint64_t u) {
    if (u <= uint64_t(INT64_MAX)) return integer(int64_t(u));
    out_ += '\x8a';  // LONG1 of 9 bytes: the value and a zero sign byte
    out_ += char(9);
    for (int i = 0; i < 8; ++i) out_ += char(uint8_t(u >> (8 * i)));
    out_ += char(0);
  }
  void real(double d) {
    out_ += 'G';  // BINFLOAT: 8-byte big-endian double
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    for (int i = 7; i >= 0; --i) out_ += char(uint8_t(bits >> (8 * i)));
  }
  void list(const json& v) {
    out_ += ']';  // EMPTY_LIST
    if (v.empty()) return;
    out_ += '(';  // MARK ... APPENDS
    for (const json& e : v) value(e);
    out_ += 'e';
  }
  void dict(const json& v) {
    out_ += '}';  // EMPTY_DICT
    if (v.empty()) return;
    out_ += '(';  // MARK ... SETITEMS
    for (auto it = v.begin(); it != v.end(); ++it) {
      text(it.key());
      value(it.value());
    }
    out_ += 'u';
  }
  std::string out_;
};

json frames(Category c, const std::string& owner) {
  return json::array({{{"filename", category_name(c)}, {"line", 0}, {"name", owner.empty() ? "(unscoped)" : owner}}});
}

}  // namespace

uint64_t memviz_address(uint64_t segment, std::size_t offset) {
  return ((segment + 1) << 36) + offset;
}

bool memviz_records(const TraceEvent& e) {
  return e.kind != TraceEvent::Kind::Retry;
}

MemvizAction memviz_action(const TraceEvent& e) {
  MemvizAction a{"alloc", 0, e.size, e.category, e.owner ? *e.owner : ""};
  if (e.block) {
    const auto [segment, offset] = CachingAllocator::position(static_cast<const CachingAllocator::Block*>(e.block));
    a.addr = memviz_address(segment, offset);
  }
  switch (e.kind) {
    case TraceEvent::Kind::Alloc:
      break;
    case TraceEvent::Kind::Free:
      a.action = "free_completed";
      break;
    case TraceEvent::Kind::SegmentAlloc:
      a.action = "segment_alloc", a.owner.clear();
      break;
    case TraceEvent::Kind::SegmentFree:
      a.action = "segment_free", a.owner.clear();
      break;
    case TraceEvent::Kind::OOM:
      a.action = "oom", a.size = e.requested;
      break;
    case TraceEvent::Kind::Retry:
      HR_ASSERT(false, "memory_viz has no action for a retry");
      break;
  }
  return a;
}

std::string memviz_snapshot(const AllocatorSnapshot& state, const std::vector<MemvizAction>& history,
                            const std::string& device) {
  json segments = json::array();
  for (const AllocatorSnapshot::Segment& seg : state.segments) {
    const uint64_t base = memviz_address(seg.id, 0);
    json blocks = json::array();
    int64_t allocated = 0, requested = 0;
    for (const AllocatorSnapshot::Block& b : seg.blocks) {
      json f = b.allocated ? frames(b.category, b.owner) : json::array();
      const uint64_t addr = base + b.offset;
      // torch 2.x reads address, size, requested_size, state and frames; torch 1.13 reads size, state and
      // history (one entry per allocation of the block, with its frames).
      json block = {{"address", addr},
                    {"size", b.size},
                    {"requested_size", b.allocated ? b.requested : 0},
                    {"state", b.allocated ? "active_allocated" : "inactive"},
                    {"frames", f}};
      if (b.allocated) {
        block["history"] = json::array({{{"addr", addr}, {"real_size", b.requested}, {"frames", f}}});
        allocated += int64_t(b.size);
        requested += int64_t(b.requested);
      }
      blocks.push_back(std::move(block));
    }
    segments.push_back({{"device", 0},
                        {"address", base},
                        {"total_size", seg.size},
                        {"allocated_size", allocated},
                        {"active_size", allocated},
                        {"requested_size", requested},
                        {"stream", 0},
                        {"segment_type", seg.small ? "small" : "large"},
                        {"segment_pool_id", json::array({0, 0})},
                        {"is_expandable", false},
                        {"frames", json::array()},
                        {"blocks", std::move(blocks)}});
  }
  json trace = json::array();
  for (const MemvizAction& a : history) {
    json f = a.owner.empty() && std::strncmp(a.action, "segment", 7) == 0 ? json::array() : frames(a.category, a.owner);
    json t = {{"action", a.action},
              {"addr", a.addr},
              {"size", a.size},
              {"stream", 0},
              {"time_us", int64_t(trace.size())},  // the history's order (the allocator keeps no clock)
              {"frames", std::move(f)}};
    if (std::strcmp(a.action, "oom") == 0) t["device_free"] = a.device_free;
    trace.push_back(std::move(t));
  }
  const json snapshot = {{"segments", std::move(segments)},
                         {"device_traces", json::array({std::move(trace)})},
                         {"allocator_settings", {{"device", device}, {"allocator", "headroom caching"}}}};
  return Pickler().dump(snapshot);
}

namespace {

using Block = CachingAllocator::Block;

// Replays `trace` on a replica of `start` up to request `stop` (all of them: SIZE_MAX); returns the
// index of the first request at which allocated bytes reached their final peak.
std::size_t replay_until(const AllocatorSnapshot& start, const RequestTrace& trace, std::size_t stop, PeakState* out) {
  CachingAllocator a(start, make_meta_allocator(0), "replay");
  std::vector<MemvizAction> history;
  if (out)
    a.set_trace([&](const TraceEvent& e) {
      if (memviz_records(e)) history.push_back(memviz_action(e));
    });
  const std::vector<AllocRequest>& reqs = trace.requests();
  HR_CHECK(trace.repeats().empty(), "[memviz] a trace with repeated stretches (record the step without them)");
  std::vector<Block*> blocks(reqs.size(), nullptr);
  int64_t best = a.stats().allocated_bytes.current;
  std::size_t at = SIZE_MAX;  // none: the stretch never rose above where it started
  for (std::size_t i = 0; i < reqs.size() && i < stop; ++i) {
    const AllocRequest& r = reqs[i];
    if (r.alloc) {
      MemoryScope scope(r.category, r.owner);
      blocks[i] = a.allocate(r.bytes);
      const int64_t now = a.stats().allocated_bytes.current;
      if (now > best) best = now, at = i;
    } else {
      a.free(blocks[r.pairs]);
      blocks[r.pairs] = nullptr;
    }
  }
  if (out) {
    a.set_trace({});
    out->state = a.snapshot();
    out->history = std::move(history);
    out->peak_allocated = a.stats().allocated_bytes.current;
  }
  return at;
}

}  // namespace

PeakState state_at_peak(const AllocatorSnapshot& start, const RequestTrace& trace) {
  const std::size_t at = replay_until(start, trace, SIZE_MAX, nullptr);
  PeakState p;
  replay_until(start, trace, at == SIZE_MAX ? 0 : at + 1, &p);
  return p;
}

}  // namespace hr::core
