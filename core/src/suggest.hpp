// "Did you mean": the closest known name to a word, by edit distance. The config reader and the
// environment check both use it; each decides how far a typo may reach.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

namespace hetmesh {

// Levenshtein distance between `a` and `b`.
size_t edit_distance(std::string_view a, std::string_view b);

struct Suggestion {
  std::string_view name;
  size_t distance = 0;
};
// The candidate closest to `word` (the first of equals), or nullopt when there is none.
std::optional<Suggestion> closest_name(std::string_view word,
                                       std::span<const std::string_view> candidates);

}  // namespace hetmesh
