// Exactness by construction, checked: building the engine and running two training steps of every strategy
// combination allocates on the meta device exactly what it allocates on the CPU (the same sizes, in the same
// order, in the same categories, for the same owners), on the device and on the host. A difference is
// reported at its first event. The test command runs this under every oneDNN ISA level the CPU supports.
#include <gtest/gtest.h>

#include <functional>

#include "core/memory/device_memory.h"
#include "models/layers.h"
#include "models/llava.h"
#include "step_cases.h"
#include "train/planner.h"

using namespace hr;
using namespace hr::core;
using hr::test::StepCase;

namespace {

struct Event {
  TraceEvent::Kind kind;
  std::size_t size, requested;
  Category category;
  std::string owner;
  bool operator==(const Event&) const = default;
};

std::string describe(const Event& e) {
  static const char* kinds[] = {"alloc", "free", "segment alloc", "segment free", "out of memory", "retry"};
  return str(kinds[int(e.kind)], " ", e.size, " B (", e.requested, " requested), ", category_name(e.category),
             ", owner '", e.owner, "'");
}

struct Traces {
  std::vector<Event> device, host;
};

using BatchOf = std::function<data::LoadedBatch(const hr::test::StepEngine&)>;

// Two steps of case c on `device`; with `batch_of`, each micro-batch is that batch instead of the case's shape's.
Traces traced_steps(const StepCase& c, Device device, const BatchOf& batch_of = {}) {
  const bool meta = device.type == DeviceType::Meta;
  const Device host = meta ? Device{DeviceType::Meta, 1} : Device::host();
  configure_device(device, {});
  configure_device(host, {});
  Traces t;
  bool paused = false;  // during the random initialisation, which a dry run does not do
  auto record = [&paused](std::vector<Event>& into) {
    return [&into, &paused](const TraceEvent& e) {
      if (!paused) into.push_back({e.kind, e.size, e.requested, e.category, e.owner ? *e.owner : ""});
    };
  };
  allocator_for(device)->set_trace(record(t.device));
  allocator_for(host)->set_trace(record(t.host));
  {
    // The initialisation's cached host segments are released, so both devices enter the compared part alike.
    hr::test::StepEngine engine(c, device, [&](bool initialising) {
      if (!initialising) allocator_for(host)->empty_cache();
      paused = initialising;
    });
    std::function<data::LoadedBatch()> batch;
    if (batch_of) batch = [&] { return batch_of(engine); };
    engine.step(batch);
    engine.step(batch);
  }
  allocator_for(device)->set_trace({});
  allocator_for(host)->set_trace({});
  return t;
}

void expect_same(const std::vector<Event>& cpu, const std::vector<Event>& meta, const std::string& what) {
  const std::size_t n = std::min(cpu.size(), meta.size());
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_EQ(cpu[i], meta[i]) << what << ": event " << i << " of " << cpu.size()
                               << " differs\n  cpu:  " << describe(cpu[i]) << "\n  meta: " << describe(meta[i]);
  ASSERT_EQ(cpu.size(), meta.size()) << what << ": one device has more events than the other (first extra: "
                                     << describe(cpu.size() > n ? cpu[n] : meta[n]) << ")";
}

class StepTrace : public testing::TestWithParam<StepCase> {};

}  // namespace

TEST_P(StepTrace, MetaAllocatesExactlyAsCpu) {
  const StepCase& c = GetParam();
  const Traces cpu = traced_steps(c, Device::cpu());
  const Traces meta = traced_steps(c, Device::meta());
  ASSERT_FALSE(cpu.device.empty());
  expect_same(cpu.device, meta.device, c.name + " device");
  expect_same(cpu.host, meta.host, c.name + " host");
}

INSTANTIATE_TEST_SUITE_P(Strategies, StepTrace, testing::ValuesIn(hr::test::step_cases()),
                         [](const testing::TestParamInfo<StepCase>& p) { return p.param.name; });

// train.padding_free: a batch's shape lists the sequences its loss reads (each row through its last labelled token;
// none for a row without labels) and how many of each one's last positions the last layer runs (from the first the
// loss reads, where that keeps at most half), and the dry run's synthetic batch of that shape has that shape again,
// so its memory is the batch's. The planner's worst case (every position labelled) packs and trims nothing; nor does
// a run with padding_free off.
TEST(PaddingFree, ABatchShapeListsItsSequencesAndTailsAndItsSyntheticBatchHasThatShape) {
  const train::RunConfig c = train::load_config(
      "",
      {"model.preset=tiny", "model.vision.image_size=8", "model.vision.patch_size=4", "model.llm.vocab_size=300",
       "model.image_token_index=299", "data.max_seq_len=24", "train.micro_batch_size=3"},
      1);
  ASSERT_EQ(c.padding_free, train::PaddingFree::On) << "auto is on for the CPU";
  const models::LlavaConfig& m = c.model.config;
  const Device host{DeviceType::Meta, 1};
  configure_device(host, {});
  using V = std::vector<int64_t>;
  auto shape = [](V packed, V tails) { return train::MicroShape{3, 24, 3, {}, std::move(packed), std::move(tails)}; };
  const train::MicroShape worst = shape({}, {});
  EXPECT_EQ(train::shape_of(train::synthetic_batch(m, worst, host).batch, c), worst);
  for (const train::MicroShape& s : {shape({23, 24}, {}), shape({23, 24}, {3, 2}), shape({2}, {}), shape({24, 2}, {}),
                                     shape({}, {5, 12, 2}), shape({15, 15}, {13, 2}), shape({9}, {})}) {
    const data::Batch b = train::synthetic_batch(m, s, host).batch;
    EXPECT_EQ(train::shape_of(b, c), s) << ::testing::PrintToString(s.packed) << " "
                                        << ::testing::PrintToString(s.tails);
    train::RunConfig off = c;
    off.padding_free = train::PaddingFree::Off;
    EXPECT_EQ(train::shape_of(b, off), worst) << "padding_free off";
  }
  EXPECT_THROW(train::synthetic_batch(m, shape({1}, {}), host), Error) << "a sequence of 1";
  EXPECT_THROW(train::synthetic_batch(m, shape({24, 24, 24}, {}), host), Error) << "packs nothing";
  EXPECT_THROW(train::synthetic_batch(m, shape({24, 24, 24, 2}, {}), host), Error) << "more sequences than rows";
  EXPECT_THROW(train::synthetic_batch(m, shape({21, 24}, {20, 20}), host), Error) << "over half";
  EXPECT_THROW(train::synthetic_batch(m, shape({21, 24}, {2}), host), Error) << "a tail per sequence";
  EXPECT_THROW(train::synthetic_batch(m, shape({21, 24}, {1, 2}), host), Error) << "the loss reads 2";

  // A batch of hand-made labels: row 0 labelled from position 6 up to 20 (read from 5), row 1 nowhere (position 0's
  // label is never predicted, so it does not count), row 2 at its last position only (read at 22).
  data::Batch b = train::synthetic_batch(m, worst, host).batch;
  for (int64_t t = 0; t < 24; ++t) {
    b.labels[std::size_t(t)] = t <= 20 && t > 5 ? 7 : -100;
    b.labels[std::size_t(24 + t)] = t == 0 ? 7 : -100;
    b.labels[std::size_t(48 + t)] = t == 23 ? 7 : -100;
  }
  EXPECT_EQ(models::loss_lengths(b, -100), (V{21, 0, 24}));
  EXPECT_EQ(train::shape_of(b, c), shape({21, 24}, {16, 2}));
  EXPECT_EQ(models::tail_lengths(b, -100, models::packed_lengths(b, -100)), (V{16, 2}));
  EXPECT_THROW(models::tail_lengths(b, -100, V{21, 0}), Error) << "a packed length per row";
  b.labels[std::size_t(6)] = -100;  // row 0 read from 6, row 2 from 9
  b.labels[std::size_t(48 + 10)] = 7;
  EXPECT_EQ(train::shape_of(b, c), shape({21, 24}, {})) << "tails of 15 and 15 rows keep over half of 45";
  b.labels[std::size_t(24 + 23)] = 7;  // row 1 read at 22
  EXPECT_EQ(train::shape_of(b, c), shape({21, 24, 24}, {15, 2, 15}));
  b.labels[std::size_t(23)] = 7;  // every row labelled to its end
  EXPECT_EQ(train::shape_of(b, c), shape({}, {18, 2, 15})) << "nothing packs, but the last layer trims";
  b.labels[std::size_t(24 + 1)] = 7;
  EXPECT_EQ(train::shape_of(b, c), worst) << "row 1 read from 0: 57 of 72 rows";
}

// The last layer's rows of back-to-back sequences of 13, 7 and 5 rows keeping their last 4, 2 and 3: rows 9..12,
// 18..19 and 22..24 of its input, at 0, 4 and 6 of its output; a tail of none, or of more than its sequence, and a
// tail count that is not the sequences' are refused.
TEST(PaddingFree, TheTailRowsAreEachSequencesLastRowsBackToBack) {
  using V = std::vector<int64_t>;
  const std::vector<models::RowRun> runs = models::tail_runs({13, 7, 5}, {4, 2, 3});
  ASSERT_EQ(runs.size(), 3u);
  const int64_t want[3][3] = {{9, 0, 4}, {18, 4, 2}, {22, 6, 3}};
  for (std::size_t s = 0; s < 3; ++s)
    EXPECT_EQ((V{runs[s].from, runs[s].to, runs[s].count}), (V{want[s][0], want[s][1], want[s][2]})) << s;
  EXPECT_TRUE(models::tail_runs({}, {}).empty());
  EXPECT_THROW(models::tail_runs({13, 7}, {4, 0}), Error) << "a tail of no rows";
  EXPECT_THROW(models::tail_runs({13, 7}, {4, 8}), Error) << "more rows than the sequence";
  EXPECT_THROW(models::tail_runs({13, 7}, {4}), Error) << "a tail per sequence";
}

// A hand-made batch whose rows keep 13, 7 and 5 positions, the last layer their last 4, 2 and 3 (row 0 with a gap in
// its labels), allocates on the CPU, event for event, what the meta device allocates for the dry run of its shape,
// whose synthetic batch labels every position of those tails.
TEST(PaddingFree, AHandMadeBatchAllocatesWhatTheDryRunOfItsShapeDoes) {
  const StepCase c{
      "padding_free_hand_made", 1, {"train.micro_batch_size=3", "memory.precision=bf16"}, {13, 7, 5}, {4, 2, 3}};
  const BatchOf hand_made = [](const hr::test::StepEngine& e) {
    train::MicroShape s = e.step_shapes().front();
    s.packed.clear();
    s.tails.clear();
    data::LoadedBatch lb = train::synthetic_batch(e.config().model.config, s, e.host());
    const int64_t keep[3] = {13, 7, 5};
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t t = 0; t < s.seq; ++t) lb.batch.labels[std::size_t(r * s.seq + t)] = -100;
    lb.batch.labels[std::size_t(10)] = lb.batch.labels[std::size_t(12)] = 7;  // read at 9 and 11
    lb.batch.labels[std::size_t(s.seq + 6)] = 7;
    lb.batch.labels[std::size_t(2 * s.seq + 3)] = lb.batch.labels[std::size_t(2 * s.seq + 4)] = 7;
    EXPECT_EQ(models::loss_lengths(lb.batch, -100), std::vector<int64_t>(keep, keep + 3));
    EXPECT_EQ(train::shape_of(lb.batch, e.config()), e.step_shapes().front());
    return lb;
  };
  const Traces cpu = traced_steps(c, Device::cpu(), hand_made);
  const Traces meta = traced_steps(c, Device::meta());
  ASSERT_FALSE(cpu.device.empty());
  expect_same(cpu.device, meta.device, "device");
  expect_same(cpu.host, meta.host, "host");
}
