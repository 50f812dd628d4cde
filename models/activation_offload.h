// memory.offload_activations: cpu (DeepSpeed's cpu_checkpointing, Megatron's activation offloading). What a
// checkpointed block keeps for its backward (its input under full checkpointing; under selective also the attention
// output, its log-sum-exp and the residual) waits on the host between the block's forward and its backward:
// - forward: after block i, its kept tensors leave for the host on the side stream while block i+1 computes; after
//   block i+1 they have arrived and block i's device memory is released;
// - backward: before block i, its tensors are back (they came while the block after it, in the backward's order,
//   computed) and the next block's start coming back.
// So the device holds at most two blocks' kept tensors where it held every block's; the host holds the rest
// (category activations, in the host section). The tower's last block never leaves: its backward comes first.
// Copies move bytes unchanged, so gradients are bit for bit those of the run without offload.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace hr::models {

class ActivationOffload {
 public:
  ActivationOffload() = default;
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;
  ~ActivationOffload();  // waits for copies still moving (a pass ended early)

  // Forward, after block `index` (whose host copies `owner` owns): `kept` (pointers into its saved tensors) leave
  // for the host, and the block sent before it releases its device memory.
  void send(std::size_t index, std::vector<core::Tensor*> kept, const std::string& owner);
  // After the tower's forward: the last block sent releases its device memory.
  void sent_all();
  // Backward, before block `index`: its tensors are on the device again (fetched now where they were not ahead),
  // and block index - 1 (`previous_owner`'s; none for block 0) starts coming back while block `index` computes.
  void before_backward(std::size_t index, const std::string& owner, const std::string* previous_owner);

 private:
  struct Block {
    std::vector<core::Tensor*> fields;
    core::Device device;
    bool fetched = false;
  };
  void arrive();                  // waits for the side copies; swaps the fields that left for their host copies
  void fetch(std::size_t index);  // starts block `index`'s tensors back to the device
  std::map<std::size_t, Block> blocks_;
  std::vector<std::pair<core::Tensor*, core::Tensor>> leaving_;  // fields and the host copies they are moving into
  std::vector<core::Tensor> arriving_;                           // host copies being read back
  core::Device device_;
  bool moving_ = false;
};

}  // namespace hr::models
