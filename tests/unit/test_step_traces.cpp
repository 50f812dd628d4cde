// Exactness by construction, checked: building the engine and running two training steps of every strategy
// combination allocates on the meta device exactly what it allocates on the CPU (the same sizes, in the same
// order, in the same categories, for the same owners), on the device and on the host. A difference is
// reported at its first event. The test command runs this under every oneDNN ISA level the CPU supports.
#include <gtest/gtest.h>

#include <functional>

#include "core/memory/device_memory.h"
#include "step_cases.h"

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

Traces traced_steps(const StepCase& c, Device device) {
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
    engine.step();
    engine.step();
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
