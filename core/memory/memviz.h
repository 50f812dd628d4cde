// Allocator snapshots in the format PyTorch's memory_viz reads (pytorch.org/memory_viz, and the
// torch.cuda._memory_viz helpers): a pickle of {"segments": [...], "device_traces": [[...]]} with the fields
// torch.cuda.memory._snapshot() produces. Every block's frames carry headroom's owner (the frame's name) and
// category (its file name), so a snapshot dragged into memory_viz shows which module's blocks filled which
// segment. Addresses are made up, one range per segment: segment n starts at (n + 1) << 36.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/memory/caching_allocator.h"
#include "core/memory/replay.h"

namespace hr::core {

// One entry of the allocator's history as memory_viz draws it (its "device_traces").
struct MemvizAction {
  const char* action;  // alloc, free_completed, segment_alloc, segment_free, oom
  uint64_t addr = 0;
  std::size_t size = 0;
  Category category = Category::Activations;
  std::string owner;
  int64_t device_free = 0;  // oom: the bytes the device had left
};

uint64_t memviz_address(uint64_t segment, std::size_t offset);
// Whether memory_viz has an action for this kind of event (a retry has none: its segment frees follow).
bool memviz_records(const TraceEvent& e);
// The entry for one allocator event memviz_records (`e.block` still valid: call from the trace function).
MemvizAction memviz_action(const TraceEvent& e);

// The pickle. `history` becomes device_traces[0]; `device` names the device in the allocator settings.
std::string memviz_snapshot(const AllocatorSnapshot& state, const std::vector<MemvizAction>& history,
                            const std::string& device);

// Where a recorded stretch (a dry-run step) reaches its allocated peak when replayed from `start`: the
// allocator's layout at that moment and the history up to it.
struct PeakState {
  AllocatorSnapshot state;
  std::vector<MemvizAction> history;
  int64_t peak_allocated = 0;
};
PeakState state_at_peak(const AllocatorSnapshot& start, const RequestTrace& trace);

}  // namespace hr::core
