// "Did you mean" (suggest.hpp).
#include "suggest.hpp"

#include <algorithm>
#include <vector>

namespace hetmesh {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::optional<Suggestion> closest_name(std::string_view word,
                                       std::span<const std::string_view> candidates) {
  std::optional<Suggestion> best;
  for (std::string_view c : candidates)
    if (size_t d = edit_distance(word, c); !best || d < best->distance) best = Suggestion{c, d};
  return best;
}

}  // namespace hetmesh
