// The table-driven op test: for every case, forward vs a naive double reference, backward vs central finite
// differences of that reference, in f32 and bf16; and meta allocates exactly what the CPU allocates.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/memory/device_memory.h"
#include "op_cases.h"

using namespace hr;
using namespace hr::core;
using hr::test::OpCase;

namespace hr::core {
void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
}  // namespace hr::core
using hr::test::make_tensors;
using hr::test::round_to;
using hr::test::rounded_inputs;
using hr::test::Values;

namespace {

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> c = hr::test::op_cases();
  return c;
}

const OpCase& find(const std::string& name) {
  for (const OpCase& c : cases())
    if (c.name == name) return c;
  throw Error("no case " + name);
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double e : v) m = std::max(m, std::fabs(e));
  return m;
}

std::string name_of(const testing::TestParamInfo<std::tuple<std::string, DType>>& p) {
  return std::get<0>(p.param) + "_" + dtype_name(std::get<1>(p.param));
}

std::vector<std::string> case_names() {
  std::vector<std::string> n;
  for (const OpCase& c : hr::test::op_cases()) n.push_back(c.name);
  return n;
}

class OpTest : public testing::TestWithParam<std::tuple<std::string, DType>> {};

}  // namespace

TEST_P(OpTest, ForwardMatchesReference) {
  const OpCase& c = find(std::get<0>(GetParam()));
  const DType dt = std::get<1>(GetParam());
  Values v = rounded_inputs(c, dt);
  Tensor out = c.forward(make_tensors(c, v, dt, Device::cpu()));
  std::vector<float> got = out.to_floats();
  std::vector<double> ref = c.reference(v);
  ASSERT_EQ(got.size(), ref.size()) << c.name;
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    double e = std::fabs(double(got[i]) - ref[i]);
    if (e > worst) worst = e, at = i;
  }
  const double tol = dt == DType::F32 ? c.tol_f32 : c.tol_bf16_fwd;
  EXPECT_LE(worst, tol * std::max(max_abs(ref), 1e-6))
      << c.name << ": worst element " << at << " got " << got[at] << " want " << ref[at];
}

TEST_P(OpTest, BackwardMatchesFiniteDifferences) {
  const OpCase& c = find(std::get<0>(GetParam()));
  const DType dt = std::get<1>(GetParam());
  Values v = rounded_inputs(c, dt);
  std::vector<Tensor> t = make_tensors(c, v, dt, Device::cpu());
  Tensor out = c.forward(t);
  // Upstream gradient R, rounded to the output dtype; the loss is sum(out * R).
  std::mt19937 rng(99);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> r(std::size_t(out.numel()));
  for (double& e : r) e = round_to(u(rng), out.dtype());
  Tensor dy = Tensor::from_floats(std::vector<float>(r.begin(), r.end()), out.shape(), out.dtype(), Device::cpu());
  std::vector<Tensor> grads = c.backward(t, dy);

  auto loss = [&](const Values& x) {
    std::vector<double> y = c.reference(x);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * r[i];
    return s;
  };
  std::size_t g = 0;
  for (std::size_t k = 0; k < c.inputs.size(); ++k) {
    if (!c.inputs[k].differentiable) continue;
    ASSERT_LT(g, grads.size()) << c.name << ": backward returned too few gradients";
    const Tensor& grad = grads[g++];
    ASSERT_EQ(grad.shape(), c.inputs[k].shape) << c.name << " gradient " << k;
    std::vector<float> an = grad.to_floats();
    const int64_t n = int64_t(v[k].size());
    const int64_t step = std::max<int64_t>(1, n / 64);
    std::vector<double> fd, got;
    std::vector<int64_t> where;
    for (int64_t e = (step > 1 ? 7 % step : 0); e < n; e += step) {
      const double h = 1e-5 * std::max(1.0, std::fabs(v[k][e]));
      Values p = v, m = v;
      p[k][e] += h;
      m[k][e] -= h;
      fd.push_back((loss(p) - loss(m)) / (2 * h));
      got.push_back(an[e]);
      where.push_back(e);
    }
    double worst = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < fd.size(); ++i) {
      double err = std::fabs(got[i] - fd[i]);
      if (err > worst) worst = err, at = i;
    }
    const double tol = dt == DType::F32 ? c.tol_f32 : c.tol_bf16_bwd;
    EXPECT_LE(worst, tol * std::max(max_abs(fd), 1e-6))
        << c.name << " d(input " << k << ")[" << where[at] << "]: got " << got[at] << ", finite difference " << fd[at];
  }
  EXPECT_EQ(g, grads.size()) << c.name << ": backward returned extra gradients";
}

namespace {
struct Event {
  TraceEvent::Kind kind;
  std::size_t size, requested;
  Category category;
  bool operator==(const Event& o) const {
    return kind == o.kind && size == o.size && requested == o.requested && category == o.category;
  }
};

struct TracedRun {
  std::vector<Event> events;
  int64_t peak_allocated, peak_reserved;
};

TracedRun traced_run(const OpCase& c, DType dt, Device dev) {
  configure_device(dev, {});
  auto alloc = allocator_for(dev);
  TracedRun run;
  alloc->set_trace([&](const TraceEvent& e) { run.events.push_back({e.kind, e.size, e.requested, e.category}); });
  {
    Values v = rounded_inputs(c, dt);
    std::vector<Tensor> t = make_tensors(c, v, dt, dev);
    Tensor out = c.forward(t);
    Tensor dy = Tensor::full(out.shape(), 0.5f, out.dtype(), dev);
    std::vector<Tensor> grads = c.backward(t, dy);
  }
  alloc->set_trace({});
  MemoryStats s = alloc->stats();
  run.peak_allocated = s.allocated_bytes.peak;
  run.peak_reserved = s.reserved_bytes.peak;
  return run;
}
}  // namespace

TEST_P(OpTest, MetaAllocatesExactlyAsCpu) {
  const OpCase& c = find(std::get<0>(GetParam()));
  const DType dt = std::get<1>(GetParam());
  TracedRun cpu = traced_run(c, dt, Device::cpu());
  TracedRun meta = traced_run(c, dt, Device::meta());
  ASSERT_FALSE(cpu.events.empty());
  ASSERT_EQ(cpu.events.size(), meta.events.size()) << c.name;
  for (std::size_t i = 0; i < cpu.events.size(); ++i)
    ASSERT_TRUE(cpu.events[i] == meta.events[i]) << c.name << ": event " << i << " differs: cpu size "
                                                 << cpu.events[i].size << " meta size " << meta.events[i].size;
  EXPECT_EQ(cpu.peak_allocated, meta.peak_allocated);
  EXPECT_EQ(cpu.peak_reserved, meta.peak_reserved);
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTest,
                         testing::Combine(testing::ValuesIn(case_names()), testing::Values(DType::F32, DType::BF16)),
                         name_of);
