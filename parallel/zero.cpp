// ZeRO stages 0-3 and CPU offload over parameter groups: sharding, gather/release, gradient reduction,
// the sharded optimizer step, and checkpoint shards that reload at any world size.
#include "parallel/zero.h"

#include <algorithm>
#include <cmath>

#include "core/memory/category.h"
#include "core/memory/timeline.h"
#include "core/ops/copy.h"
#include "core/ops/elementwise.h"
#include "core/ops/optimizer.h"
#include "core/ops/reduce.h"

namespace hr::parallel {

using namespace hr::core;
using optim::OptimizerKind;

struct Zero::Group {
  // One parameter's part of the group: rank q owns elements [q * block, q * block + valid(q)) of it, kept at
  // `offset` in the group's shard.
  struct Segment {
    Param* param;
    int64_t numel = 0, block = 0, offset = 0;
    bool decay = true;
    float lr_ratio = 1.f;
    bool had_grad = false;  // on any rank this step (after finish_gradients)
  };
  std::string name;
  GroupKind kind = GroupKind::DecoderLayer;
  bool trainable = false;
  DType dtype = DType::F32;
  std::vector<Segment> segs;
  int64_t shard = 0;               // elements of each rank's shard (the sum of the segments' blocks)
  optim::OptimizerState state;     // (shard) f32 on the state device: master weights and moments
  Tensor grads;                    // (shard) stage >= 2: this rank's reduced gradients
  Tensor params;                   // (shard) stage 3: this rank's parameters (on the host with offload_params)
  bool gathered = false;
  Tensor whole;                                  // (world x shard) stage 3: an all-gather started, not finished
  std::unique_ptr<PendingCollective> pending;    // that all-gather, where it runs in the background
  Tensor reduce_in, reduce_out;                  // stage >= 2: a reduce-scatter started, not finished
  std::unique_ptr<PendingCollective> reducing;   // that reduce-scatter

  // Elements of `seg` held by rank q of `world`.
  static int64_t valid(const Segment& seg, int q) {
    return std::clamp<int64_t>(seg.numel - int64_t(q) * seg.block, 0, seg.block);
  }
};

namespace {

Tensor flat(const Tensor& t) { return t.view({t.numel()}); }

// A model group's parameters split by whether they train (LoRA: a layer's frozen base and its adapters), each part
// sharded on its own under the group's name (a split group: "<group>.frozen" and "<group>.trainable").
// A quantized base's weights (u8 blobs) are a part of their own, "<group>.quantized".
std::vector<std::pair<std::string, std::vector<Param*>>> parts_of(const core::ParamGroup& mg) {
  std::vector<Param*> frozen, trainable, quantized;
  for (Param* p : mg.params) (p->quantized() ? quantized : p->trainable ? trainable : frozen).push_back(p);
  if (quantized.empty() && (frozen.empty() || trainable.empty())) return {{mg.name, mg.params}};
  std::vector<std::pair<std::string, std::vector<Param*>>> parts;
  if (!frozen.empty()) parts.emplace_back(mg.name + ".frozen", frozen);
  if (!quantized.empty()) parts.emplace_back(mg.name + ".quantized", quantized);
  if (!trainable.empty()) parts.emplace_back(mg.name + ".trainable", trainable);
  return parts;
}

// dst (S) <- the blocks of rank q taken from each parameter's full tensor `src(p)` (missing: left as is).
template <typename F>
void pack(const Zero::Group& g, int q, const Tensor& dst, F&& src) {
  for (const auto& seg : g.segs) {
    const int64_t v = Zero::Group::valid(seg, q);
    Tensor full = src(seg.param);
    if (v == 0 || !full.defined()) continue;
    copy_(dst.slice(0, seg.offset, seg.offset + v), flat(full).slice(0, q * seg.block, q * seg.block + v));
  }
}

// Each parameter's full tensor `dst(p)` <- its blocks from every rank's shard in `whole` (world x S).
template <typename F>
void unpack(const Zero::Group& g, int world, const Tensor& whole, F&& dst) {
  for (const auto& seg : g.segs) {
    Tensor full = flat(dst(seg.param));
    for (int q = 0; q < world; ++q) {
      const int64_t v = Zero::Group::valid(seg, q);
      if (v) copy_(full.slice(0, q * seg.block, q * seg.block + v), whole.slice(0, q * g.shard + seg.offset, q * g.shard + seg.offset + v));
    }
  }
}

int64_t shard_size(std::vector<Zero::Group::Segment>& segs, int world) {
  int64_t S = 0;
  for (auto& seg : segs) {
    seg.block = (seg.numel + world - 1) / world;
    seg.offset = S;
    S += seg.block;
  }
  return S;
}

}  // namespace

void validate(const ZeroOptions& z, const optim::OptimizerConfig& opt) {
  HR_CHECK(z.stage >= 0 && z.stage <= 3, "[config] memory.zero_stage ", z.stage, " is not one of: 0, 1, 2, 3, auto");
  HR_CHECK(z.offload_params == Offload::None || z.stage == 3, "[config] memory.offload_params: cpu needs "
           "memory.zero_stage: 3 (parameters are offloaded as ZeRO-3 shards); zero_stage is ", z.stage);
  HR_CHECK(!(opt.kind == OptimizerKind::Adafactor && (z.stage > 0 || z.offload_optimizer != Offload::None)),
           "[config] train.optimizer: adafactor keeps factored row/column moments that cannot be sharded; use "
           "adamw or sgd with memory.zero_stage > 0 or memory.offload_optimizer");
  HR_CHECK(z.bucket_bytes > 0, "[config] parallel.bucket_size must be positive");
}

Zero::Zero(GroupedParams& model, Communicator& comm, const optim::OptimizerConfig& opt, const ZeroOptions& z)
    : model_(model), comm_(comm), opt_(opt), z_(z) {
  validate(z, opt);
  device_ = model.params().device();
  // A plan on the meta device keeps its "host" on a second meta device: nothing is really allocated.
  host_ = device_.type == DeviceType::Meta ? Device{DeviceType::Meta, 1} : Device::host();
  state_device_ = z.offload_optimizer == Offload::Cpu ? host_ : device_;
  shard_world_ = z.stage >= 1 ? comm.world() : 1;
  shard_rank_ = z.stage >= 1 ? comm.rank() : 0;
  const auto& mg = model.groups();
  groups_.resize(mg.size());
  if (z.stage == 0 && z.offload_optimizer == Offload::None) {
    local_ = std::make_unique<optim::Optimizer>(model.params(), opt);
    model.set_hooks(this);  // no group of its own: the hooks only mark the phases in a memory timeline
    return;
  }
  for (std::size_t gi = 0; gi < mg.size(); ++gi) {
    if (mg[gi].params.empty()) continue;
    for (const auto& [part_name, part] : parts_of(mg[gi])) {
      const bool trainable = part[0]->trainable;
      if (!trainable && z.stage < 3) continue;
      auto g = std::make_unique<Group>();
      g->name = part_name;
      g->kind = mg[gi].kind;
      g->trainable = trainable;
      g->dtype = part[0]->dtype;
      for (Param* p : part) {
        HR_ASSERT(p->dtype == g->dtype, "group ", g->name, " mixes dtypes");
        g->segs.push_back({p, p->numel(), 0, 0, optim::decays(*p)});
      }
      g->shard = shard_size(g->segs, shard_world_);
      Tensor mine;  // this rank's block of the current parameters
      {
        MemoryScope scope(Category::Workspace, g->name);
        mine = Tensor::zeros({g->shard}, g->dtype, device_);
        pack(*g, shard_rank_, mine, [](Param* p) { return p->data; });
      }
      if (trainable) {
        Tensor master;
        if (z.offload_optimizer == Offload::Cpu || g->dtype != DType::F32) {
          MemoryScope scope(Category::MasterParams, g->name);
          master = Tensor::empty({g->shard}, DType::F32, state_device_);
          copy_(master, mine);
        }
        MemoryScope scope(Category::Optimizer, g->name);
        g->state = optim::zero_moments(opt, {g->shard}, state_device_);
        g->state.master = master;
        if (z.stage >= 2) {
          MemoryScope gs(Category::Grads, g->name);
          g->grads = Tensor::zeros({g->shard}, g->dtype, device_);
        }
      }
      if (z.stage == 3) {
        MemoryScope scope(Category::Params, g->name);
        g->params = Tensor::empty({g->shard}, g->dtype, z.offload_params == Offload::Cpu ? host_ : device_);
        copy_(g->params, mine);
        mine = Tensor();
        for (auto& seg : g->segs) seg.param->data = Tensor();
      }
      groups_[gi].push_back(std::move(g));
    }
  }
  model.set_hooks(this);
}

Zero::~Zero() { model_.set_hooks(nullptr); }

int64_t Zero::steps() const { return local_ ? local_->steps() : steps_; }

void Zero::set_lr_ratio(GroupKind kind, float ratio) {
  if (local_) return local_->set_lr_ratio(kind, ratio);
  for (auto& parts : groups_)
    for (auto& g : parts)
      if (g->kind == kind)
        for (auto& seg : g->segs) seg.lr_ratio = ratio;
}

// ---- parameters (stage 3) ----

void Zero::start_gather(Group& g) {
  if (g.gathered || g.whole.defined()) return;
  const int W = shard_world_;
  for (auto& seg : g.segs) {
    MemoryScope scope(Category::Params, core::owner_of(seg.param->name));
    seg.param->data = Tensor::empty(seg.param->shape, g.dtype, device_);
  }
  MemoryScope scope(Category::Comm, g.name);
  g.whole = Tensor::empty({int64_t(W) * g.shard}, g.dtype, device_);
  Tensor block = g.whole.slice(0, int64_t(shard_rank_) * g.shard, int64_t(shard_rank_ + 1) * g.shard);
  copy_(block, g.params);  // brings an offloaded shard in
  if (W > 1) {
    core::TraceSpan span("comm", "all_gather start ", g.name);
    g.pending = comm_.all_gather_start(block, g.whole);
  }
}

void Zero::finish_gather(Group& g) {
  if (g.gathered) return;
  start_gather(g);
  if (g.pending) {
    core::TraceSpan span("comm", "all_gather wait ", g.name);
    g.pending->wait();
    g.pending.reset();
  }
  unpack(g, shard_world_, g.whole, [](Param* p) { return p->data; });
  g.whole = Tensor();
  g.gathered = true;
}

void Zero::gather(Group& g) { finish_gather(g); }

void Zero::prefetch(Pass pass, std::size_t position) {
  const std::vector<int>& order = model_.pass_order(pass);
  for (std::size_t ahead = 1; ahead <= std::size_t(std::max(0, z_.prefetch_groups)); ++ahead)
    if (position + ahead < order.size())
      for (auto& g : groups_[std::size_t(order[position + ahead])]) start_gather(*g);
}

void Zero::poll_gathers() {
  for (auto& parts : groups_)
    for (auto& g : parts)
      if (g->pending) g->pending->poll();
  for (Group* g : reducing_)
    if (g->reducing) g->reducing->poll();
}

// After a step that failed part-way (an out-of-memory error): gathers started ahead and reductions still running
// are finished (every rank started them) and their buffers freed; the step starts again from no gradients.
void Zero::drop_pending_gathers() {
  for (Group* g : reducing_) {
    if (g->reducing) g->reducing->wait();
    g->reducing.reset();
    g->reduce_in = g->reduce_out = Tensor();
  }
  reducing_.clear();
  for (auto& parts : groups_)
    for (auto& g : parts) {
      if (g->pending) g->pending->wait();
      g->pending.reset();
      if (g->whole.defined() && !g->gathered) release(*g);
      g->whole = Tensor();
    }
}

void Zero::release(Group& g) {
  for (auto& seg : g.segs) seg.param->data = Tensor();
  g.gathered = false;
}

// ---- the hooks, and every rank's collectives in the same order ----

void Zero::before(int group, Pass pass) {
  catch_up(pass, group);
  poll_gathers();
  // The group's slice spans its gather, its computation and its reduction (ended in after()).
  if (core::tracing()) {
    core::trace_begin(pass == Pass::Forward ? "forward" : "backward",
                      str(pass == Pass::Forward ? "forward " : "backward ", group_name(group)));
    ++open_slices_;
  }
  use(group, pass);
}

std::string Zero::group_name(int group) const {
  const auto& all = model_.params().groups();
  return group >= 0 && std::size_t(group) < all.size() ? all[std::size_t(group)].name : str("group ", group);
}

void Zero::after(int group, Pass pass) {
  const std::vector<int>& order = model_.pass_order(pass);
  std::size_t& at = cursor_[int(pass)];
  HR_ASSERT(at < order.size() && order[at] == group, "group ", group, " ended out of its pass's order");
  done(group, pass);
  poll_gathers();
  if (open_slices_ > 0) core::trace_end(), --open_slices_;
  ++at;
}

void Zero::end_pass(Pass pass) {
  catch_up(pass, -1);
  if (pass == Pass::Backward) finish_reductions();
  cursor_[int(pass)] = 0;
}

void Zero::catch_up(Pass pass, int until) {
  const std::vector<int>& order = model_.pass_order(pass);
  std::size_t& at = cursor_[int(pass)];
  for (; at < order.size() && order[at] != until; ++at) {  // groups this rank skipped: their collectives still
    use(order[at], pass);
    done(order[at], pass);
  }
  HR_ASSERT(until < 0 || at < order.size(), "group ", until, " is not in its pass's order");
}

void Zero::use(int group, Pass pass) {
  if (z_.stage != 3) return;
  for (auto& g : groups_[std::size_t(group)]) finish_gather(*g);
  prefetch(pass, cursor_[int(pass)]);  // the cursor is at `group` (before() and catch_up() put it there)
}

void Zero::done(int group, Pass pass) {
  for (auto& g : groups_[std::size_t(group)]) {
    if (pass == Pass::Backward && z_.stage >= 2 && g->trainable) reduce_scatter_grads(*g);
    if (z_.stage == 3) release(*g);
  }
}

// ---- gradients ----

void Zero::begin_step() {
  cursor_ = {};  // a step redone after an out-of-memory error starts its passes again
  drop_pending_gathers();
  for (; open_slices_ > 0; --open_slices_) core::trace_end();  // the slices an out-of-memory error left open
  if (z_.stage >= 2) {
    for (auto& parts : groups_)
      for (auto& g : parts)
        if (g->trainable) {
          fill_(g->grads, 0.f);
          for (auto& seg : g->segs) seg.had_grad = false;
        }
  }
  model_.params().zero_grad();
}

void Zero::reduce_scatter_grads(Group& g) {
  // The previous group's reduce-scatter had this group's backward to run under; it ends now, before this
  // group's starts, so that at most one is in flight.
  finish_reductions();
  const int W = shard_world_;
  Tensor whole, mine;
  {
    MemoryScope scope(Category::Comm, g.name);
    whole = Tensor::zeros({int64_t(W) * g.shard}, g.dtype, device_);
    for (auto& seg : g.segs) {
      if (!seg.param->grad.defined()) continue;
      seg.had_grad = true;
      Tensor gf = flat(seg.param->grad);
      for (int q = 0; q < W; ++q) {
        const int64_t v = Group::valid(seg, q);
        if (v) copy_(whole.slice(0, q * g.shard + seg.offset, q * g.shard + seg.offset + v), gf.slice(0, q * seg.block, q * seg.block + v));
      }
    }
    for (auto& seg : g.segs) seg.param->grad = Tensor();
    mine = Tensor::empty({g.shard}, g.dtype, device_);
    if (z_.overlap_comm) {
      core::TraceSpan span("comm", "reduce_scatter start ", g.name);
      g.reducing = comm_.reduce_scatter_start(whole, mine);
      g.reduce_in = whole;
      g.reduce_out = mine;
      reducing_.push_back(&g);
      return;
    }
    core::TraceSpan span("comm", "reduce_scatter ", g.name);
    comm_.reduce_scatter(whole, mine);
  }
  add_(g.grads, mine);
}

void Zero::finish_reductions() {
  for (Group* g : reducing_) {
    if (g->reducing) {
      core::TraceSpan span("comm", "reduce_scatter wait ", g->name);
      g->reducing->wait();
      g->reducing.reset();
    }
    g->reduce_in = Tensor();
    add_(g->grads, g->reduce_out);
    g->reduce_out = Tensor();
  }
  reducing_.clear();
}

std::vector<bool> Zero::on_any_rank(const std::vector<bool>& mine) {
  if (comm_.world() == 1) return mine;
  MemoryScope scope(Category::Comm, "zero.flags");
  Tensor flags = Tensor::empty({int64_t(mine.size())}, DType::I64, host_);
  core::TraceSpan span("comm", "all_reduce gradient flags");
  if (host_.type == DeviceType::Meta) return mine;  // a plan: the planned world's ranks do what this one does
  for (std::size_t i = 0; i < mine.size(); ++i) flags.data<int64_t>()[i] = mine[i];
  comm_.all_reduce(flags);
  std::vector<bool> any(mine.size());
  for (std::size_t i = 0; i < mine.size(); ++i) any[i] = flags.data<int64_t>()[i] > 0;
  return any;
}

void Zero::all_reduce_grads() {
  // Whether each trainable parameter has a gradient on some rank: those take part (zeros where missing).
  std::vector<Param*> params;
  for (const auto& p : model_.params().all())
    if (p->trainable) params.push_back(p.get());
  std::vector<bool> has(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) has[i] = params[i]->grad.defined();
  has = on_any_rank(has);
  std::vector<Param*> live;
  for (std::size_t i = 0; i < params.size(); ++i)
    if (has[i]) {
      params[i]->ensure_grad();
      live.push_back(params[i]);
    }
  // Buckets of up to bucket_bytes of one dtype; a gradient larger than a bucket is reduced in place.
  std::vector<Param*> bucket;
  int64_t elems = 0;
  auto flush = [&] {
    if (bucket.empty()) return;
    core::TraceSpan span("comm", "all_reduce gradients (", bucket.size(), bucket.size() == 1 ? " tensor)" : " tensors)");
    if (bucket.size() == 1) {
      comm_.all_reduce(bucket[0]->grad);
    } else {
      MemoryScope scope(Category::Comm, "gradient_bucket");
      Tensor buf = Tensor::empty({elems}, bucket[0]->dtype, device_);
      int64_t at = 0;
      for (Param* p : bucket) copy_(buf.slice(0, at, at + p->numel()), flat(p->grad)), at += p->numel();
      comm_.all_reduce(buf);
      at = 0;
      for (Param* p : bucket) copy_(flat(p->grad), buf.slice(0, at, at + p->numel())), at += p->numel();
    }
    bucket.clear();
    elems = 0;
  };
  for (Param* p : live) {
    const int64_t bytes = p->numel() * int64_t(dtype_size(p->dtype));
    if (!bucket.empty() && (bucket[0]->dtype != p->dtype ||
                            (elems * int64_t(dtype_size(p->dtype)) + bytes) > z_.bucket_bytes))
      flush();
    bucket.push_back(p);
    elems += p->numel();
  }
  flush();
}

void Zero::finish_gradients() {
  finish_reductions();
  if (comm_.world() > 1 && z_.stage <= 1) all_reduce_grads();
  if (z_.stage >= 2) {
    // Which parameters had a gradient on any rank this step: the others are not stepped (as a single process).
    std::vector<Group::Segment*> segs;
    for (auto& parts : groups_)
      for (auto& g : parts)
        if (g->trainable)
          for (auto& seg : g->segs) segs.push_back(&seg);
    std::vector<bool> had(segs.size());
    for (std::size_t i = 0; i < segs.size(); ++i) had[i] = segs[i]->had_grad;
    had = on_any_rank(had);
    for (std::size_t i = 0; i < segs.size(); ++i) segs[i]->had_grad = had[i];
  }
}

float Zero::grad_norm() {
  std::vector<Tensor> grads;
  if (z_.stage >= 2) {
    for (auto& parts : groups_)
      for (auto& g : parts)
        if (g->trainable) grads.push_back(g->grads);
    const double local = grads.empty() ? 0.0 : double(global_norm(grads).item());
    core::TraceSpan span("comm", "all_reduce gradient norm");
    const double total = comm_.world() > 1 ? comm_.sum(local * local) : local * local;
    return float(std::sqrt(total));
  }
  for (const auto& p : model_.params().all())
    if (p->grad.defined()) grads.push_back(p->grad);
  return grads.empty() ? 0.f : global_norm(grads).item();
}

// ---- the optimizer step ----

void Zero::end_step() { model_.params().zero_grad(); }

void Zero::step(float lr, float grad_scale) {
  if (local_) return local_->step(lr, grad_scale);
  ++steps_;
  for (auto& parts : groups_)
    for (auto& g : parts)
      if (g->trainable) step_group(*g, lr, grad_scale);
}

void Zero::step_group(Group& g, float lr, float grad_scale) {
  const int W = shard_world_, r = shard_rank_;
  const bool offload = z_.offload_optimizer == Offload::Cpu;
  // This rank's gradient shard.
  Tensor grad = g.grads;
  if (z_.stage <= 1) {
    MemoryScope scope(Category::Grads, g.name);
    grad = Tensor::zeros({g.shard}, g.dtype, device_);
    pack(g, r, grad, [](Param* p) { return p->grad; });
  }
  // Where the updated parameters go: the stage-3 shard, or this rank's block of a buffer to all-gather.
  Tensor whole, dst = g.params;
  if (z_.stage <= 2) {
    MemoryScope scope(Category::Comm, g.name);
    whole = Tensor::empty({int64_t(W) * g.shard}, g.dtype, device_);
    dst = whole.slice(0, int64_t(r) * g.shard, int64_t(r + 1) * g.shard);
    pack(g, r, dst, [](Param* p) { return p->data; });
  }
  Tensor upd_param = dst, upd_grad = grad;
  if (offload) {
    if (upd_param.device() != state_device_) {
      MemoryScope scope(Category::Params, g.name);
      upd_param = dst.to(state_device_);
    }
    MemoryScope scope(Category::Grads, g.name);
    upd_grad = grad.to(state_device_);
  }
  for (const auto& seg : g.segs) {
    const int64_t v = Group::valid(seg, r);
    if (!seg.had_grad && z_.stage >= 2) continue;
    if (z_.stage <= 1 && !seg.param->grad.defined()) continue;
    if (v == 0) continue;
    const int64_t end = seg.offset + v;
    optim::update(opt_, upd_param.slice(0, seg.offset, end), upd_grad.slice(0, seg.offset, end),
                  g.state.slice(seg.offset, end), {lr * seg.lr_ratio, seg.decay ? opt_.weight_decay : 0.f, steps_, grad_scale});
  }
  if (!upd_param.same_storage(dst)) copy_(dst, upd_param);
  upd_param = upd_grad = grad = Tensor();
  if (z_.stage <= 2) {
    if (W > 1) {
      core::TraceSpan span("comm", "all_gather updated ", g.name);
      comm_.all_gather(dst, whole);
    }
    unpack(g, W, whole, [](Param* p) { return p->data; });
  }
}

// ---- checkpoints ----

core::NamedTensors Zero::state() const {
  if (local_) return local_->state();
  NamedTensors out;
  Tensor world = Tensor::from_ints({shard_world_}, {1}, DType::I64, Device::host());
  out.emplace_back("zero.shard_world", world);
  for (const auto& parts : groups_)
    for (const auto& g : parts) {
      g->state.for_each([&](const char* suffix, const Tensor& t) { out.emplace_back(g->name + suffix, t); });
      if (g->params.defined()) out.emplace_back(g->name + ".params", g->params);
    }
  return out;
}

namespace {

// The old shard world of a set of files, checked against the number of files.
int old_world(const std::vector<const Checkpoint*>& files, const char* what) {
  HR_CHECK(!files.empty(), "[checkpoint] no ", what, " shard files");
  HR_CHECK(files[0]->contains("zero.shard_world"), "[checkpoint] ", what, " was not written by a sharded run "
           "(no zero.shard_world)");
  const int w = int(files[0]->get("zero.shard_world").to_ints().at(0));
  HR_CHECK(w == 1 || w == int(files.size()), "[checkpoint] ", what, " shards were written by ", w, " ranks but ",
           files.size(), " files were found");
  return w;
}

// Copies this rank's block of every segment of `g` (new layout) from the old shards named `name`.
void reshard(const Zero::Group& g, int new_rank, const Tensor& dst, const std::vector<const Checkpoint*>& files,
             const std::string& name, int w_old) {
  int64_t off_old = 0;
  for (const auto& seg : g.segs) {
    const int64_t s_old = (seg.numel + w_old - 1) / w_old;
    const int64_t v = Zero::Group::valid(seg, new_rank), start = int64_t(new_rank) * seg.block;
    for (int64_t e = start; e < start + v;) {
      const int q = int(e / s_old);
      const int64_t in_q = e - int64_t(q) * s_old, run = std::min(start + v - e, s_old - in_q);
      const Checkpoint& f = *files[std::size_t(w_old == 1 ? 0 : q)];
      HR_CHECK(f.contains(name), "[checkpoint] the shard file of rank ", q, " has no tensor '", name, "'");
      Tensor src = f.get(name);
      copy_(dst.slice(0, seg.offset + (e - start), seg.offset + (e - start) + run), src.slice(0, off_old + in_q, off_old + in_q + run));
      e += run;
    }
    off_old += s_old;
  }
}

}  // namespace

void Zero::load_state(const std::vector<const Checkpoint*>& files, int64_t steps) {
  if (local_) {
    HR_CHECK(files.size() == 1 && !files[0]->contains("zero.shard_world"),
             "[checkpoint] the optimizer state was written by a sharded run (", files.size(), " shard files); this run "
             "uses zero_stage 0 without offload, which loads a single optimizer.safetensors");
    local_->load_state(*files[0], steps);
    return;
  }
  const int w = old_world(files, "optimizer");
  for (auto& parts : groups_)
    for (auto& g : parts) {
      if (g->params.defined()) reshard(*g, shard_rank_, g->params, files, g->name + ".params", w);
      if (!g->trainable) continue;
      g->state.for_each([&](const char* suffix, const Tensor& t) {
        const std::string name = g->name + suffix;
        if (files[0]->contains(name) || std::string(suffix) != ".master") reshard(*g, shard_rank_, t, files, name, w);
        else if (g->params.defined()) copy_(t, g->params);  // written without master weights (an f32 run)
        else pack(*g, shard_rank_, t, [](Param* p) { return p->data; });
      });
    }
  steps_ = steps;
}

core::NamedTensors Zero::consolidate(const std::vector<ParamGroup>& groups, const std::vector<const Checkpoint*>& files) {
  const int w = old_world(files, "parameter");
  NamedTensors out;
  for (const auto& mg : groups)
    for (const auto& [part_name, part] : mg.params.empty() ? decltype(parts_of(mg)){} : parts_of(mg)) {
      if (!files[0]->contains(part_name + ".params")) continue;
      Group g;
      g.name = part_name;
      for (Param* p : part) g.segs.push_back({p, p->numel(), 0, 0, true});
      g.shard = shard_size(g.segs, 1);  // the full layout: one "rank" holding everything
      Tensor full = Tensor::empty({g.shard}, files[0]->get(part_name + ".params").dtype(), Device::host());
      reshard(g, 0, full, files, part_name + ".params", w);
      for (const auto& seg : g.segs) out.emplace_back(seg.param->name, full.slice(0, seg.offset, seg.offset + seg.numel).view(seg.param->shape));
    }
  return out;
}

}  // namespace hr::parallel
