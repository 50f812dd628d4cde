// Spelling suggestions for error messages: the closest valid name to a typo.
#pragma once

#include <string>
#include <vector>

namespace hr {

// The candidate with the smallest edit distance to `name`, or "" when none is plausibly meant.
std::string closest_match(const std::string& name, const std::vector<std::string>& candidates);

// "; did you mean 'x'?" or "" — ready to append to an error message.
std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace hr
