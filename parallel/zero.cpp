// ZeRO stages 0-3 and CPU offload over parameter groups: sharding, the hooks that run every rank's collectives
// in the same order (the collectives themselves: zero_comm.cpp), the sharded optimizer step, and checkpoint
// shards that reload at any world size.
#include "parallel/zero.h"

#include <algorithm>
#include <cmath>

#include "core/memory/category.h"
#include "core/memory/timeline.h"
#include "core/ops/copy.h"
#include "core/ops/elementwise.h"
#include "core/ops/optimizer.h"
#include "core/ops/reduce.h"
#include "parallel/zero_group.h"

namespace hr::parallel {

using namespace hr::core;
using optim::OptimizerKind;

namespace {

// A model group's parameters split by whether they train (LoRA: a layer's frozen base and its adapters), each part
// sharded on its own under the group's name (a split group: "<group>.frozen" and "<group>.trainable").
// A quantized base's weights (u8 blobs) are a part of their own, "<group>.quantized". With 8-bit AdamW the
// trainable parameters whose moments stay f32 (optim::keeps_f32_moments) are a part of their own too,
// "<group>.trainable_f32", so that each part's states are of one kind.
std::vector<std::pair<std::string, std::vector<Param*>>> parts_of(const core::ParamGroup& mg, bool eight_bit) {
  std::vector<Param*> frozen, trainable, trainable_f32, quantized;
  for (Param* p : mg.params)
    (p->quantized()                              ? quantized
     : !p->trainable                             ? frozen
     : eight_bit && optim::keeps_f32_moments(*p) ? trainable_f32
                                                 : trainable)
        .push_back(p);
  const int kinds = !frozen.empty() + !quantized.empty() + !trainable.empty() + !trainable_f32.empty();
  if (kinds == 1) return {{mg.name, mg.params}};
  std::vector<std::pair<std::string, std::vector<Param*>>> parts;
  if (!frozen.empty()) parts.emplace_back(mg.name + ".frozen", frozen);
  if (!quantized.empty()) parts.emplace_back(mg.name + ".quantized", quantized);
  if (!trainable.empty()) parts.emplace_back(mg.name + ".trainable", trainable);
  if (!trainable_f32.empty()) parts.emplace_back(mg.name + ".trainable_f32", trainable_f32);
  return parts;
}

// The alignment of a part's per-rank blocks in a run whose layout aligns to `align`: only 8-bit AdamW's codes need
// it (the trainable parts whose moments are not f32).
int64_t part_align(const std::vector<Param*>& part, int64_t align) {
  return align > 1 && part[0]->trainable && !part[0]->quantized() && !optim::keeps_f32_moments(*part[0]) ? align : 1;
}

// Rank q owns elements [q * block, q * block + valid) of each parameter: block is ceil(numel / world), rounded up
// to a multiple of `align` (8-bit AdamW's block, so that every rank's blocks are blocks of the whole parameter).
int64_t block_of(int64_t numel, int world, int64_t align) {
  return ((numel + world - 1) / world + align - 1) / align * align;
}

int64_t shard_size(std::vector<Zero::Group::Segment>& segs, int world, int64_t align) {
  int64_t S = 0;
  for (auto& seg : segs) {
    seg.block = block_of(seg.numel, world, align);
    seg.offset = S;
    S += seg.block;
  }
  return S;
}

// A borrowed group's own backward, where it has one, comes after its borrower's: done() leaves the completion of
// its shard (and its copy to an offloaded optimizer) to that later reduction.
void check_borrowing(GroupedParams& model) {
  const std::vector<int>& back = model.pass_order(Pass::Backward);
  for (auto at = back.begin(); at != back.end(); ++at) {
    const int lent = model.borrowed_group(*at);
    HR_ASSERT(lent < 0 || std::find(back.begin(), at, lent) == at, "group ", lent, " is borrowed by group ", *at,
              " but its backward comes first");
  }
}

}  // namespace

void validate(const ZeroOptions& z, const optim::OptimizerConfig& opt) {
  HR_CHECK(z.stage >= 0 && z.stage <= 3, "[config] memory.zero_stage ", z.stage, " is not one of: 0, 1, 2, 3, auto");
  HR_CHECK(z.offload_params == Offload::None || z.stage == 3,
           "[config] memory.offload_params: cpu needs "
           "memory.zero_stage: 3 (parameters are offloaded as ZeRO-3 shards); zero_stage is ",
           z.stage);
  HR_CHECK(!(opt.kind == OptimizerKind::Adafactor && (z.stage > 0 || z.offload_optimizer != Offload::None)),
           "[config] train.optimizer: adafactor keeps factored row/column moments that cannot be sharded; use "
           "adamw or sgd with memory.zero_stage > 0 or memory.offload_optimizer");
  HR_CHECK(z.bucket_bytes > 0, "[config] parallel.bucket_size must be positive");
}

Zero::Zero(GroupedParams& model, Communicator& comm, const optim::OptimizerConfig& opt, const ZeroOptions& z)
    : model_(model), comm_(comm), opt_(opt), z_(z), buckets_(std::make_unique<Buckets>()) {
  validate(z, opt);
  device_ = model.params().device();
  // A plan on the meta device keeps its "host" on a second meta device: nothing is really allocated.
  host_ = device_.type == DeviceType::Meta ? Device{DeviceType::Meta, 1} : Device::host();
  state_device_ = z.offload_optimizer == Offload::Cpu ? host_ : device_;
  shard_world_ = z.stage >= 1 ? comm.world() : 1;
  if (opt.kind == OptimizerKind::AdamW8bit) align_ = kAdam8bitBlock;
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
    for (const auto& [part_name, part] : parts_of(mg[gi], align_ > 1)) {
      const bool trainable = part[0]->trainable;
      if (!trainable && z.stage < 3) continue;
      groups_[gi].push_back(make_group(part_name, part, mg[gi].kind));
    }
  }
  check_borrowing(model);
  model.set_hooks(this);
}

// The group of `part` (parameters of one dtype and trainability): this rank's shard of its states (master weights,
// moments), of its reduced gradients at stages 2-3, and of its parameters at stage 3 (the whole ones released).
std::unique_ptr<Zero::Group> Zero::make_group(const std::string& name, const std::vector<Param*>& part,
                                              GroupKind kind) {
  auto g = std::make_unique<Group>();
  g->name = name;
  g->kind = kind;
  g->trainable = part[0]->trainable;
  g->dtype = part[0]->dtype;
  g->grad_dtype = part[0]->grad_dtype;
  for (Param* p : part) {
    HR_ASSERT(p->dtype == g->dtype && p->grad_dtype == g->grad_dtype, "group ", g->name, " mixes dtypes");
    g->segs.push_back({p, p->numel(), 0, 0, optim::decays(*p)});
  }
  g->opt = optim::moments_for(opt_, *part[0]);  // one kind a part (parts_of)
  g->shard = shard_size(g->segs, shard_world_, part_align(part, align_));
  Tensor mine;  // this rank's block of the current parameters
  {
    MemoryScope scope(Category::Workspace, g->name);
    mine = Tensor::zeros({g->shard}, g->dtype, device_);
    pack(*g, shard_rank_, mine, [](Param* p) { return p->data; });
  }
  if (g->trainable) make_states(*g, mine);
  if (z_.stage == 3) {
    MemoryScope scope(Category::Params, g->name);
    g->params = Tensor::empty({g->shard}, g->dtype, z_.offload_params == Offload::Cpu ? host_ : device_);
    copy_(g->params, mine);
    mine = Tensor();
    for (auto& seg : g->segs) seg.param->data = Tensor();
  }
  return g;
}

// A trainable group's optimizer states where they live (f32 master weights where the parameters are not f32 or the
// states are offloaded) and, at stages 2-3, its gradient shard.
void Zero::make_states(Group& g, const Tensor& mine) {
  Tensor master;
  if (z_.offload_optimizer == Offload::Cpu || g.dtype != DType::F32) {
    MemoryScope scope(Category::MasterParams, g.name);
    master = Tensor::empty({g.shard}, DType::F32, state_device_);
    copy_(master, mine);
  }
  MemoryScope scope(Category::Optimizer, g.name);
  g.state = optim::zero_moments(g.opt, {g.shard}, state_device_);
  g.state.master = master;
  if (z_.stage >= 2) {
    MemoryScope gs(Category::Grads, g.name);
    g.grads = Tensor::zeros({g.shard}, g.grad_dtype, device_);
  }
}

Zero::~Zero() {
  model_.set_hooks(nullptr);
}

int64_t Zero::steps() const {
  return local_ ? local_->steps() : steps_;
}

void Zero::set_lr_ratio(GroupKind kind, float ratio) {
  if (local_) return local_->set_lr_ratio(kind, ratio);
  for (auto& parts : groups_)
    for (auto& g : parts)
      if (g->kind == kind)
        for (auto& seg : g->segs) seg.lr_ratio = ratio;
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

std::vector<Zero::Group*> Zero::parts_used_by(int group) {
  std::vector<Group*> parts;
  for (const int gi : {group, model_.borrowed_group(group)})
    if (gi >= 0)
      for (auto& g : groups_[std::size_t(gi)]) parts.push_back(g.get());
  return parts;
}

void Zero::use(int group, Pass pass) {
  if (z_.stage != 3) return;
  for (Group* g : parts_used_by(group)) finish_gather(*g);
  prefetch(pass, cursor_[int(pass)]);  // the cursor is at `group` (before() and catch_up() put it there)
}

// A borrowed group's gradients are reduced when the borrower's backward ends, so that the full gradient is not
// kept across the layers between; where the group's own backward follows in the pass, it reduces again (adding to
// the shard) and that reduction is the one that completes the shard.
void Zero::done(int group, Pass pass) {
  if (pass == Pass::Backward && last_micro_ && buckets_gradients()) bucket_grads(group);
  const int lent = model_.borrowed_group(group);
  for (const int gi : {group, lent}) {
    if (gi < 0) continue;
    const bool completes = gi == group || !later_in_pass(gi, pass);
    for (auto& g : groups_[std::size_t(gi)]) {
      if (pass == Pass::Backward && z_.stage >= 2 && g->trainable) reduce_scatter_grads(*g, completes);
      if (z_.stage == 3) release(*g);
    }
  }
}

bool Zero::later_in_pass(int group, Pass pass) const {
  const std::vector<int>& order = model_.pass_order(pass);
  const std::size_t at = cursor_[int(pass)];
  return at < order.size() && std::find(order.begin() + std::ptrdiff_t(at) + 1, order.end(), group) != order.end();
}

// ---- gradients ----

void Zero::begin_step() {
  cursor_ = {};  // a step redone after an out-of-memory error starts its passes again
  drop_pending_gathers();
  settle_side_copies();
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

void Zero::end_step() {
  settle_side_copies();  // a skipped step's gradients sent ahead
  model_.params().zero_grad();
}

void Zero::step(float lr, float grad_scale) {
  if (local_) return local_->step(lr, grad_scale);
  ++steps_;
  side_copies_done(device_);  // the gradients sent to the host during the backward have arrived
  for (auto& parts : groups_)
    for (auto& g : parts)
      if (g->trainable) step_group(*g, lr, grad_scale);
  settle_side_copies();
}

void Zero::step_group(Group& g, float lr, float grad_scale) {
  const int W = shard_world_;
  Tensor grad = gradient_shard(g);
  Tensor whole;
  const Tensor dst = update_target(g, &whole);
  // The update runs where the states are: parameters elsewhere (offloaded states, or offload_params without them)
  // come there for it and go back after.
  Tensor upd_param = dst, upd_grad = grad;
  if (upd_param.device() != state_device_) {
    MemoryScope scope(Category::Params, g.name);
    upd_param = dst.to(state_device_);
  }
  if (z_.offload_optimizer == Offload::Cpu) {
    MemoryScope scope(Category::Grads, g.name);
    upd_grad = g.host_grads.defined() ? g.host_grads : grad.to(state_device_);
  }
  update_segments(g, upd_param, upd_grad, lr, grad_scale);
  if (!upd_param.same_storage(dst)) store_update(dst, upd_param);
  g.host_grads = Tensor();
  upd_param = upd_grad = grad = Tensor();
  if (z_.stage <= 2) {
    if (W > 1) {
      core::TraceSpan span("comm", "all_gather updated ", g.name);
      comm_.all_gather(dst, whole);
    }
    unpack(g, W, whole, [](Param* p) { return p->data; });
  }
}

// This rank's gradient shard: reduced during the backward (stages 2-3), or packed from the parameters' gradients.
Tensor Zero::gradient_shard(Group& g) {
  if (z_.stage >= 2) return g.grads;
  MemoryScope scope(Category::Grads, g.name);
  Tensor grad = Tensor::zeros({g.shard}, g.grad_dtype, device_);
  pack(g, shard_rank_, grad, [](Param* p) { return p->grad; });
  return grad;
}

// Where the updated parameters go: the stage-3 shard, or this rank's block of a buffer to all-gather (`whole`).
Tensor Zero::update_target(Group& g, Tensor* whole) {
  if (z_.stage == 3) return g.params;
  const int W = shard_world_, r = shard_rank_;
  MemoryScope scope(Category::Comm, g.name);
  *whole = Tensor::empty({int64_t(W) * g.shard}, g.dtype, device_);
  Tensor dst = whole->slice(0, int64_t(r) * g.shard, int64_t(r + 1) * g.shard);
  pack(g, r, dst, [](Param* p) { return p->data; });
  return dst;
}

// The optimizer over each segment this rank holds a valid block of, where its gradient exists.
void Zero::update_segments(Group& g, const Tensor& param, const Tensor& grad, float lr, float grad_scale) {
  for (const auto& seg : g.segs) {
    const int64_t v = Group::valid(seg, shard_rank_);
    const bool has_grad = z_.stage >= 2 ? seg.had_grad : seg.param->grad.defined();
    if (!has_grad || v == 0) continue;
    const int64_t end = seg.offset + v;
    optim::update(g.opt, param.slice(0, seg.offset, end), grad.slice(0, seg.offset, end),
                  g.state.slice(seg.offset, end),
                  {lr * seg.lr_ratio, seg.decay ? opt_.weight_decay : 0.f, steps_, grad_scale});
  }
}

// The update, made where the states are, back where the parameters live. Stage 3 uses the shard only in the next
// step's gathers: its upload runs on the side stream while the next group updates on the host (the previous
// group's upload has arrived before its host copy goes). Below stage 3 the all-gather reads it at once.
void Zero::store_update(const Tensor& dst, const Tensor& updated) {
  if (z_.stage != 3) {
    copy_(dst, updated);
    return;
  }
  side_copies_done(device_);
  uploading_ = Tensor();
  copy_side_(dst, updated);
  uploading_ = updated;
}

// ---- checkpoints ----

core::NamedTensors Zero::state() const {
  if (local_) return local_->state();
  NamedTensors out;
  Tensor world = Tensor::from_ints({shard_world_}, {1}, DType::I64, Device::host());
  out.emplace_back("zero.shard_world", world);
  if (align_ > 1) out.emplace_back("zero.block_align", Tensor::from_ints({align_}, {1}, DType::I64, Device::host()));
  for (const auto& parts : groups_)
    for (const auto& g : parts) {
      g->state.for_each([&](const char* suffix, const Tensor& t) { out.emplace_back(g->name + suffix, t); });
      if (g->params.defined()) out.emplace_back(g->name + ".params", g->params);
    }
  return out;
}

namespace {

// The layout a set of shard files was written in: its shard world, checked against the number of files, and its
// per-rank block alignment.
struct OldLayout {
  int world = 1;
  int64_t align = 1;
};

OldLayout old_layout(const std::vector<const Checkpoint*>& files, const char* what) {
  HR_CHECK(!files.empty(), "[checkpoint] no ", what, " shard files");
  HR_CHECK(files[0]->contains("zero.shard_world"), "[checkpoint] ", what,
           " was not written by a sharded run "
           "(no zero.shard_world)");
  OldLayout old;
  old.world = int(files[0]->get("zero.shard_world").to_ints().at(0));
  HR_CHECK(old.world == 1 || old.world == int(files.size()), "[checkpoint] ", what, " shards were written by ",
           old.world, " ranks but ", files.size(), " files were found");
  if (files[0]->contains("zero.block_align")) old.align = files[0]->get("zero.block_align").to_ints().at(0);
  HR_CHECK(old.align >= 1 && old.align <= kAdam8bitBlock, "[checkpoint] ", what, " has a zero.block_align of ",
           old.align);
  return old;
}

// Copies this rank's block of every segment of `g` (new layout) from the old shards named `name`. A state kept
// one value per `unit` elements (8-bit AdamW's block scales) is resharded by blocks: both layouts align to them.
void reshard(const Zero::Group& g, int new_rank, const Tensor& dst, const std::vector<const Checkpoint*>& files,
             const std::string& name, const OldLayout& old, int64_t unit = 1) {
  auto units = [&](int64_t elements) { return (elements + unit - 1) / unit; };
  std::vector<Param*> part;
  for (const auto& seg : g.segs) part.push_back(seg.param);
  const int64_t align = part_align(part, old.align);
  int64_t off_old = 0;
  for (const auto& seg : g.segs) {
    HR_ASSERT(seg.block % unit == 0 && seg.offset % unit == 0 && align % unit == 0, "resharding ", name,
              " by blocks of ", unit, " needs layouts aligned to them");
    const int64_t s_old = units(block_of(seg.numel, old.world, align));
    const int64_t v = units(Zero::Group::valid(seg, new_rank)), start = int64_t(new_rank) * seg.block / unit;
    const int64_t offset = seg.offset / unit;
    for (int64_t e = start; e < start + v;) {
      const int q = int(e / s_old);
      const int64_t in_q = e - int64_t(q) * s_old, run = std::min(start + v - e, s_old - in_q);
      const Checkpoint& f = *files[std::size_t(old.world == 1 ? 0 : q)];
      HR_CHECK(f.contains(name), "[checkpoint] the shard file of rank ", q, " has no tensor '", name, "'");
      Tensor src = f.get(name);
      copy_(dst.slice(0, offset + (e - start), offset + (e - start) + run),
            src.slice(0, off_old + in_q, off_old + in_q + run));
      e += run;
    }
    off_old += s_old;
  }
}

}  // namespace

void Zero::load_state(const std::vector<const Checkpoint*>& files, int64_t steps) {
  if (local_) {
    HR_CHECK(files.size() == 1 && !files[0]->contains("zero.shard_world"),
             "[checkpoint] the optimizer state was written by a sharded run (", files.size(),
             " shard files); this run "
             "uses zero_stage 0 without offload, which loads a single optimizer.safetensors");
    local_->load_state(*files[0], steps);
    return;
  }
  const OldLayout old = old_layout(files, "optimizer");
  for (auto& parts : groups_)
    for (auto& g : parts) {
      if (g->params.defined()) reshard(*g, shard_rank_, g->params, files, g->name + ".params", old);
      if (!g->trainable) continue;
      g->state.for_each([&](const char* suffix, const Tensor& t) {
        const std::string name = g->name + suffix;
        const bool scales = name.ends_with(".absmax1") || name.ends_with(".absmax2");
        if (scales)
          HR_CHECK(old.align % kAdam8bitBlock == 0, "[checkpoint] ", name, " is of a layout not aligned to ",
                   kAdam8bitBlock, "-element blocks (zero.block_align ", old.align, ")");
        if (files[0]->contains(name) || std::string(suffix) != ".master")
          reshard(*g, shard_rank_, t, files, name, old, scales ? kAdam8bitBlock : 1);
        else if (g->params.defined())
          copy_(t, g->params);  // written without master weights (an f32 run)
        else
          pack(*g, shard_rank_, t, [](Param* p) { return p->data; });
      });
    }
  steps_ = steps;
}

core::NamedTensors Zero::consolidate(const std::vector<ParamGroup>& groups,
                                     const std::vector<const Checkpoint*>& files) {
  const OldLayout old = old_layout(files, "parameter");
  NamedTensors out;
  for (const auto& mg : groups)
    for (const auto& [part_name, part] :
         mg.params.empty() ? decltype(parts_of(mg, false)){} : parts_of(mg, old.align > 1)) {
      if (!files[0]->contains(part_name + ".params")) continue;
      Group g;
      g.name = part_name;
      for (Param* p : part) g.segs.push_back({p, p->numel(), 0, 0, true});
      g.shard = shard_size(g.segs, 1, 1);  // the full layout: one "rank" holding everything
      Tensor full = Tensor::empty({g.shard}, files[0]->get(part_name + ".params").dtype(), Device::host());
      reshard(g, 0, full, files, part_name + ".params", old);
      for (const auto& seg : g.segs)
        out.emplace_back(seg.param->name, full.slice(0, seg.offset, seg.offset + seg.numel).view(seg.param->shape));
    }
  return out;
}

}  // namespace hr::parallel
