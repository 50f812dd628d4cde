// Activation checkpoint policies as data: which saved tensors of a block survive the forward pass.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace hr::models {

// none: keep everything; selective: keep the sub-block inputs and the attention output with its
// log-sum-exp (cheap to store, costly to recompute), recompute norms, projections and MLP internals;
// full: keep the block input only and recompute the whole block in backward.
enum class CheckpointKind : uint8_t { None, Selective, Full };

// How long a saved tensor lives: Input survives every policy; Selective survives none and selective;
// Internal survives only none. Frozen towers keep nothing at all (they are never differentiated).
enum class Keep : uint8_t { Input, Selective, Internal };

struct CheckpointPolicy {
  CheckpointKind kind = CheckpointKind::None;
  int every = 1;         // apply to blocks 0, every, 2*every, ...; the others keep everything
  bool offload = false;  // memory.offload_activations: what checkpointed blocks keep waits on the host
  // The planner's choice (make_plan), not a key: the last of the blocks keeps everything. Its backward follows the
  // loss at once, so recomputing it would redo the forward just run; keeping it is chosen where it raises no peak.
  bool keep_last = false;

  CheckpointKind for_block(int64_t index) const {
    return every > 0 && index % every == 0 ? kind : CheckpointKind::None;
  }
  // Block `index` of `blocks`: the same, but under keep_last the last block keeps everything.
  CheckpointKind for_block(int64_t index, int64_t blocks) const {
    return keep_last && index + 1 == blocks ? CheckpointKind::None : for_block(index);
  }
  // Whether some block of `blocks` recomputes and the last is among them: keep_last would change something.
  bool recomputes_last(int64_t blocks) const { return blocks > 0 && for_block(blocks - 1) != CheckpointKind::None; }
};

inline bool survives(Keep keep, CheckpointKind kind) {
  switch (kind) {
    case CheckpointKind::None:
      return true;
    case CheckpointKind::Selective:
      return keep != Keep::Internal;
    case CheckpointKind::Full:
      return keep == Keep::Input;
  }
  return true;
}

// Drops the saved tensors of a block that its policy does not keep. `table` lists every field with its Keep.
template <typename Saved, std::size_t N>
void apply_policy(Saved& s, const std::array<std::pair<core::Tensor Saved::*, Keep>, N>& table, CheckpointKind kind) {
  for (const auto& [field, keep] : table)
    if (!survives(keep, kind)) s.*field = core::Tensor();
}

// The saved tensors a block holds (what its policy kept).
template <typename Saved, std::size_t N>
std::vector<core::Tensor*> kept_fields(Saved& s, const std::array<std::pair<core::Tensor Saved::*, Keep>, N>& table) {
  std::vector<core::Tensor*> kept;
  for (const auto& [field, keep] : table)
    if ((s.*field).defined()) kept.push_back(&(s.*field));
  return kept;
}

// Whether block `index` of `blocks` sends what it keeps to the host (activation_offload.h): a checkpointed block
// other than the last.
inline bool offloads(const CheckpointPolicy& policy, int64_t index, int64_t blocks) {
  return policy.offload && policy.for_block(index) != CheckpointKind::None && index + 1 < blocks;
}

// Whether a block still holds every field of its table: its backward has nothing to recompute.
template <typename Saved, std::size_t N>
bool all_kept(const Saved& s, const std::array<std::pair<core::Tensor Saved::*, Keep>, N>& table) {
  for (const auto& [field, keep] : table)
    if (!(s.*field).defined()) return false;
  return true;
}

const char* checkpoint_name(CheckpointKind k);
CheckpointKind parse_checkpoint(const std::string& s);  // none | selective | full

}  // namespace hr::models
