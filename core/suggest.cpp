// Edit-distance suggestions.
#include "core/suggest.h"

#include <algorithm>

namespace hr {

namespace {
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
}  // namespace

std::string closest_match(const std::string& name, const std::vector<std::string>& candidates) {
  const std::size_t limit = std::max<std::size_t>(2, name.size() / 3);
  std::string best;
  std::size_t best_d = std::string::npos;
  for (const std::string& c : candidates) {
    std::size_t d;
    if (c.rfind(name, 0) == 0 || name.rfind(c, 0) == 0) {
      // A shared prefix of the whole shorter word counts as close (gradient_checkpoint -> ..._checkpointing).
      d = c == name ? 0 : 1;
    } else {
      // The distance is at least the difference in length: past the limit, no need to compute it (a long
      // garbage key would cost its length times every candidate's).
      const std::size_t gap = c.size() > name.size() ? c.size() - name.size() : name.size() - c.size();
      if (gap > limit) continue;
      d = edit_distance(name, c);
    }
    if (d < best_d) best_d = d, best = c;
  }
  return best_d <= limit ? best : "";
}

std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates) {
  std::string c = closest_match(name, candidates);
  return c.empty() ? "" : "; did you mean '" + c + "'?";
}

}  // namespace hr
