// ZeRO's collectives in flight: stage 3's parameter gathers (started ahead with parallel.prefetch_groups and
// finished just before a group runs), the gradient reduce-scatter of stages 2-3 (overlapped with the next group's
// backward under parallel.overlap_comm), the bucketed all-reduce of stages 0-1, and the flags that say which
// parameters had a gradient on any rank. Every rank starts them in the same order.
#include "core/memory/category.h"
#include "core/memory/timeline.h"
#include "core/ops/elementwise.h"
#include "parallel/zero_group.h"

namespace hr::parallel {

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

void Zero::gather(Group& g) {
  finish_gather(g);
}

void Zero::prefetch(Pass pass, std::size_t position) {
  const std::vector<int>& order = model_.pass_order(pass);
  for (std::size_t ahead = 1; ahead <= std::size_t(std::max(0, z_.prefetch_groups)); ++ahead)
    if (position + ahead < order.size())
      for (Group* g : parts_used_by(order[position + ahead])) start_gather(*g);
}

void Zero::poll_gathers() {
  for (auto& parts : groups_)
    for (auto& g : parts)
      if (g->pending) g->pending->poll();
  for (Group* g : reducing_)
    if (g->reducing) g->reducing->poll();
  if (buckets_->op) buckets_->op->poll();
}

// After a step that failed part-way (an out-of-memory error): gathers started ahead and reductions still running
// are finished (every rank started them) and their buffers freed; the step starts again from no gradients.
void Zero::drop_pending_gathers() {
  if (buckets_->op) buckets_->op->wait();
  *buckets_ = Buckets{};
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

// ---- gradients ----

void Zero::reduce_scatter_grads(Group& g, bool completes) {
  // The previous group's reduce-scatter had this group's backward to run under; it ends now, before this
  // group's starts, so that at most one is in flight.
  finish_reductions();
  g.completes = completes;
  const int W = shard_world_;
  Tensor whole, mine;
  {
    MemoryScope scope(Category::Comm, g.name);
    whole = Tensor::zeros({int64_t(W) * g.shard}, g.grad_dtype, device_);
    for (auto& seg : g.segs) {
      if (!seg.param->grad.defined()) continue;
      seg.had_grad = true;
      Tensor gf = flat(seg.param->grad);
      for (int q = 0; q < W; ++q) {
        const int64_t v = Group::valid(seg, q);
        if (v)
          copy_(whole.slice(0, q * g.shard + seg.offset, q * g.shard + seg.offset + v),
                gf.slice(0, q * seg.block, q * seg.block + v));
      }
    }
    for (auto& seg : g.segs) seg.param->grad = Tensor();
    mine = Tensor::empty({g.shard}, g.grad_dtype, device_);
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
  mine = Tensor();
  reduced(g);
}

void Zero::reduced(Group& g) {
  if (!g.completes || !last_micro_ || z_.offload_optimizer != Offload::Cpu) return;
  MemoryScope scope(Category::Grads, g.name);
  g.host_grads = Tensor::empty({g.shard}, g.grad_dtype, state_device_);
  copy_side_(g.host_grads, g.grads);
}

void Zero::settle_side_copies() {
  side_copies_done(device_);
  uploading_ = Tensor();
  for (auto& parts : groups_)
    for (auto& g : parts) g->host_grads = Tensor();
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
    reduced(*g);
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
  // Whether each trainable parameter has a gradient on some rank: those take part (zeros where missing). Those
  // the last backward already reduced keep theirs only if some rank had one (as if never reduced).
  std::vector<Param*> params;
  for (const auto& p : model_.params().all())
    if (p->trainable) params.push_back(p.get());
  auto& bucketed = buckets_->done;
  start_bucket();  // the last backward's buckets end before any of their gradients can be dropped
  finish_bucket();
  std::vector<bool> has(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto it = bucketed.find(params[i]);
    has[i] = it != bucketed.end() ? it->second : params[i]->grad.defined();
  }
  has = on_any_rank(has);
  std::vector<Param*> live;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (bucketed.count(params[i])) {
      if (!has[i]) params[i]->grad = Tensor();
    } else if (has[i]) {
      params[i]->ensure_grad();
      live.push_back(params[i]);
    }
  }
  bucketed.clear();
  for (Param* p : live) add_to_bucket(p);
  start_bucket();
  finish_bucket();
}

void Zero::bucket_grads(int group) {
  HR_ASSERT(z_.stage <= 1, "gradient buckets at ZeRO stage ", z_.stage);
  for (Param* p : model_.params().groups()[std::size_t(group)].params) {
    if (!p->trainable || buckets_->done.count(p)) continue;
    buckets_->done[p] = p->grad.defined();
    p->ensure_grad();
    add_to_bucket(p);
  }
}

// Buckets of up to bucket_bytes of one dtype; a gradient larger than a bucket is reduced in place.
void Zero::add_to_bucket(Param* p) {
  Buckets& b = *buckets_;
  const int64_t bytes = p->numel() * int64_t(dtype_size(p->grad_dtype));
  if (!b.filling.empty() && (b.filling[0]->grad_dtype != p->grad_dtype ||
                             b.filling_elems * int64_t(dtype_size(p->grad_dtype)) + bytes > z_.bucket_bytes))
    start_bucket();
  b.filling.push_back(p);
  b.filling_elems += p->numel();
}

void Zero::start_bucket() {
  finish_bucket();  // one bucket in flight at a time: its buffer is the only one alive
  Buckets& b = *buckets_;
  if (b.filling.empty()) return;
  const std::size_t n = b.filling.size();
  core::TraceSpan span("comm", "all_reduce start gradients (", n, n == 1 ? " tensor)" : " tensors)");
  if (n == 1) {
    b.op = comm_.all_reduce_start(b.filling[0]->grad);
  } else {
    MemoryScope scope(Category::Comm, "gradient_bucket");
    b.buffer = Tensor::empty({b.filling_elems}, b.filling[0]->grad_dtype, device_);
    int64_t at = 0;
    for (Param* p : b.filling) copy_(b.buffer.slice(0, at, at + p->numel()), flat(p->grad)), at += p->numel();
    b.op = comm_.all_reduce_start(b.buffer);
  }
  b.flying = std::move(b.filling);
  b.filling.clear();
  b.filling_elems = 0;
}

void Zero::finish_bucket() {
  Buckets& b = *buckets_;
  if (b.flying.empty()) return;
  {
    core::TraceSpan span("comm", "all_reduce wait gradients (", b.flying.size(),
                         b.flying.size() == 1 ? " tensor)" : " tensors)");
    b.op->wait();
    b.op.reset();
  }
  if (b.buffer.defined()) {
    int64_t at = 0;
    for (Param* p : b.flying) copy_(flat(p->grad), b.buffer.slice(0, at, at + p->numel())), at += p->numel();
    b.buffer = Tensor();
  }
  b.flying.clear();
}

void Zero::begin_micro_batch(MicroBatch which) {
  last_micro_ = which == MicroBatch::Last;
}

void Zero::finish_gradients() {
  finish_reductions();
  last_micro_ = false;
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

}  // namespace hr::parallel
