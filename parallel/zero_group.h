// The private parts of ZeRO shared by its files (zero.cpp: sharding, hooks, the optimizer step, checkpoints;
// zero_comm.cpp: the collectives in flight): a group's shard layout and the packing of full tensors to and from
// the flat (world x shard) layout its collectives move.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/ops/copy.h"
#include "parallel/zero.h"

namespace hr::parallel {

using namespace hr::core;

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
  DType grad_dtype = DType::F32;  // its parameters' gradients (f32 when 16-bit ones accumulate in f32)
  std::vector<Segment> segs;
  int64_t shard = 0;            // elements of each rank's shard (the sum of the segments' blocks)
  optim::OptimizerConfig opt;   // the optimizer of its parameters (f32 AdamW for 8-bit AdamW's f32-moment part)
  optim::OptimizerState state;  // (shard) on the state device: master weights and moments
  Tensor grads;                 // (shard) stage >= 2: this rank's reduced gradients
  Tensor host_grads;            // (shard) stage >= 2 with offload: `grads`, sent to the host in the last backward
  Tensor params;                // (shard) stage 3: this rank's parameters (on the host with offload_params)
  bool gathered = false;
  Tensor whole;                                 // (world x shard) stage 3: an all-gather started, not finished
  std::unique_ptr<PendingCollective> pending;   // that all-gather, where it runs in the background
  Tensor reduce_in, reduce_out;                 // stage >= 2: a reduce-scatter started, not finished
  std::unique_ptr<PendingCollective> reducing;  // that reduce-scatter
  bool completes = true;                        // whether it completes the shard (reduce_scatter_grads)

  // Elements of `seg` held by rank q of `world`.
  static int64_t valid(const Segment& seg, int q) {
    return std::clamp<int64_t>(seg.numel - int64_t(q) * seg.block, 0, seg.block);
  }
};

// Stages 0-1 with overlap_comm: the gradient buckets of the step's last backward.
struct Zero::Buckets {
  std::vector<Param*> filling;  // gradients joining the next bucket
  int64_t filling_elems = 0;
  std::vector<Param*> flying;  // the bucket whose all-reduce is running
  Tensor buffer;               // its packed gradients (a bucket of one is reduced in place)
  std::unique_ptr<PendingCollective> op;
  std::unordered_map<const Param*, bool> done;  // bucketed this step: whether this rank had a gradient
};

inline Tensor flat(const Tensor& t) {
  return t.view({t.numel()});
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
      if (v)
        copy_(full.slice(0, q * seg.block, q * seg.block + v),
              whole.slice(0, q * g.shard + seg.offset, q * g.shard + seg.offset + v));
    }
  }
}

}  // namespace hr::parallel
