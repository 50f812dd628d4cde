// Memory categories and the scoped guard that tags every allocation with a category and an owner name.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace hr::core {

enum class Category : uint8_t {
  Params,
  MasterParams,
  Grads,
  Optimizer,
  Activations,
  Workspace,
  Comm,
  IO,
};
constexpr int kNumCategories = 8;
constexpr std::array<Category, kNumCategories> kAllCategories = {
    Category::Params,      Category::MasterParams, Category::Grads, Category::Optimizer,
    Category::Activations, Category::Workspace,    Category::Comm,  Category::IO};

const char* category_name(Category c);  // "params", "master_params", ...

// What the current thread is allocating for. Allocations made outside any scope count as activations
// owned by "" (shown as "(unscoped)"), so a forgotten scope is visible in the owner table.
struct MemoryTag {
  Category category = Category::Activations;
  std::string owner;
};

const MemoryTag& current_memory_tag();

// Sets the category (and optionally the owner) for allocations made on this thread while it lives.
// An empty owner keeps the enclosing scope's owner, so `MemoryScope ws(Category::Workspace)` inside a
// module's scope still names the module.
class MemoryScope {
 public:
  explicit MemoryScope(Category category, std::string owner = {});
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

 private:
  MemoryTag saved_;
};

}  // namespace hr::core
