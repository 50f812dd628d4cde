// A map that keeps its most recently used entries: for caches keyed by shapes, which vary over a run (batch
// lengths) and would otherwise grow with every new one.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>

namespace hr::core {

template <typename K, typename V>
class LruMap {
 public:
  explicit LruMap(std::size_t capacity) : capacity_(capacity) {}

  // The entry for `key`; when absent, `make()` makes it, after the least recently used entry is dropped if
  // the map is full. Not thread-safe.
  template <typename Make>
  V& get(const K& key, Make&& make) {
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      if (entries_.size() >= capacity_)
        entries_.erase(std::min_element(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
          return a.second.second < b.second.second;
        }));
      it = entries_.emplace(key, std::make_pair(make(), uint64_t(0))).first;
    }
    it->second.second = ++uses_;
    return it->second.first;
  }
  std::size_t size() const { return entries_.size(); }
  void clear() { entries_.clear(); }

 private:
  std::size_t capacity_;
  std::map<K, std::pair<V, uint64_t>> entries_;  // value, last use
  uint64_t uses_ = 0;
};

}  // namespace hr::core
