// Human-readable memory reports: memory_summary() and the OutOfMemory message.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/memory/caching_allocator.h"

namespace hr::core {

namespace {

std::string pad(const std::string& s, std::size_t w) {
  return s.size() >= w ? s : s + std::string(w - s.size(), ' ');
}

std::string lpad(const std::string& s, std::size_t w) {
  return s.size() >= w ? s : std::string(w - s.size(), ' ') + s;
}

std::string row(const std::string& name, const Stat& s) {
  return "  " + pad(name, 22) + lpad(format_bytes(double(s.current)), 12) + lpad(format_bytes(double(s.peak)), 12) +
         "\n";
}

// The n largest owners by current bytes (ties by name), as "name (bytes)".
std::vector<std::pair<std::string, Stat>> largest_owners(const std::unordered_map<const std::string*, Stat>& owners,
                                                         std::size_t n, bool by_peak) {
  std::vector<std::pair<std::string, Stat>> v;
  for (const auto& [o, s] : owners)
    if ((by_peak ? s.peak : s.current) > 0) v.emplace_back(o->empty() ? "(unscoped)" : *o, s);
  std::sort(v.begin(), v.end(), [&](const auto& a, const auto& b) {
    int64_t x = by_peak ? a.second.peak : a.second.current, y = by_peak ? b.second.peak : b.second.current;
    return x != y ? x > y : a.first < b.first;
  });
  if (v.size() > n) v.resize(n);
  return v;
}

}  // namespace

std::string CachingAllocator::memory_summary() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const MemoryStats& s = stats_;
  std::string out = "memory summary: " + device_name_;
  if (raw_->capacity()) out += " (capacity " + format_bytes(double(raw_->capacity())) + ")";
  out += "\n  " + pad("", 22) + lpad("current", 12) + lpad("peak", 12) + "\n";
  out += row("allocated", s.allocated_bytes);
  out += row("reserved", s.reserved_bytes);
  out += row("active", s.active_bytes);
  out += row("inactive split", s.inactive_split_bytes);
  out += row("requested", s.requested_bytes);
  out += "  by category (allocated)\n";
  for (Category c : kAllCategories) out += row(std::string("  ") + category_name(c), s.category(c));
  out += "  largest owners (peak)\n";
  for (const auto& [name, st] : largest_owners(owner_bytes_, 5, true)) out += row("  " + name, st);
  char line[160];
  std::snprintf(line, sizeof line,
                "  segments %lld (peak %lld), allocations %lld, alloc retries %lld, OOMs %lld, fragmentation %.1f%%\n",
                (long long)s.segment.current, (long long)s.segment.peak, (long long)s.allocation.current,
                (long long)s.num_alloc_retries, (long long)s.num_ooms, 100.0 * s.fragmentation());
  out += line;
  return out;
}

std::string CachingAllocator::oom_message(std::size_t requested, std::size_t rounded, std::size_t segment) const {
  const MemoryStats& s = stats_;
  const MemoryTag& tag = current_memory_tag();
  const std::size_t cap = raw_->capacity();
  const std::size_t used = raw_->used();
  std::string m = str("[memory] ", device_name_, " out of memory. Tried to allocate ", format_bytes(double(requested)));
  if (rounded != segment) m += str(" (needs a new ", format_bytes(double(segment)), " segment)");
  m += str(" for ", category_name(tag.category), " of '", tag.owner.empty() ? "(unscoped)" : tag.owner, "'. ");
  if (cap)
    m += str("Device has a total capacity of ", format_bytes(double(cap)), " of which ",
             format_bytes(double(cap > used ? cap - used : 0)), " is free. ");
  m +=
      str("Of the allocated memory ", format_bytes(double(s.allocated_bytes.current)),
          " is allocated by headroom, and ", format_bytes(double(s.reserved_bytes.current - s.allocated_bytes.current)),
          " is reserved by headroom but unallocated.\nBy category (allocated now / peak):\n");
  for (Category c : kAllCategories) {
    const Stat& st = s.category(c);
    m += str("  ", pad(category_name(c), 14), lpad(format_bytes(double(st.current)), 12), " / ",
             format_bytes(double(st.peak)), "\n");
  }
  m += "Largest owners now:";
  auto top = largest_owners(owner_bytes_, 5, false);
  if (top.empty()) m += " (none)";
  for (const auto& [name, st] : top) m += str("\n  ", pad(name, 36), lpad(format_bytes(double(st.current)), 12));
  return m;
}

}  // namespace hr::core
