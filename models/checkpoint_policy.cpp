// Checkpoint policy names.
#include "models/checkpoint_policy.h"

#include "core/check.h"

namespace hr::models {

const char* checkpoint_name(CheckpointKind k) {
  switch (k) {
    case CheckpointKind::None:
      return "none";
    case CheckpointKind::Selective:
      return "selective";
    case CheckpointKind::Full:
      return "full";
  }
  return "?";
}

CheckpointKind parse_checkpoint(const std::string& s) {
  if (s == "none" || s == "false") return CheckpointKind::None;
  if (s == "selective") return CheckpointKind::Selective;
  if (s == "full" || s == "true") return CheckpointKind::Full;
  throw Error(str("[config] gradient checkpointing '", s, "' is not one of: none, selective, full"));
}

}  // namespace hr::models
