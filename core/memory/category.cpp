// Category names and the thread-local allocation tag.
#include "core/memory/category.h"

#include "core/check.h"

namespace hr::core {

namespace {
thread_local MemoryTag t_tag;
}

const char* category_name(Category c) {
  switch (c) {
    case Category::Params:
      return "params";
    case Category::MasterParams:
      return "master_params";
    case Category::Grads:
      return "grads";
    case Category::Optimizer:
      return "optimizer";
    case Category::Activations:
      return "activations";
    case Category::Workspace:
      return "workspace";
    case Category::Comm:
      return "comm";
    case Category::IO:
      return "io";
  }
  return "?";
}

const MemoryTag& current_memory_tag() {
  return t_tag;
}

MemoryScope::MemoryScope(Category category, std::string owner) : saved_(t_tag) {
  t_tag.category = category;
  if (!owner.empty()) t_tag.owner = std::move(owner);
}

MemoryScope::~MemoryScope() {
  t_tag = std::move(saved_);
}

}  // namespace hr::core
