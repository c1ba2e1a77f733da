#include <hetmesh/afd/launch.hpp>
#include <hetmesh/core/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <set>

namespace hetmesh::afd {
namespace {

int parse_rank(std::string_view text, const std::string& value) {
  int rank = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), rank);
  if (ec != std::errc() || end != text.data() + text.size() || rank < 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("--instances {}: '{}' is not a rank", value, text));
  return rank;
}

}  // namespace

LocalInstances parse_instances(const std::vector<std::string>& values, const JobConfig& config) {
  std::set<int> attention, ffn;
  auto all = [](std::set<int>& ranks, int count) {
    for (int r = 0; r < count; ++r)
      ranks.insert(r);
  };
  if (values.empty()) {
    all(attention, config.job.attention);
    all(ffn, config.job.ffn);
  }
  for (const std::string& value : values) {
    std::string_view role = value, list;
    if (auto colon = value.find(':'); colon != std::string::npos) {
      role = std::string_view(value).substr(0, colon);
      list = std::string_view(value).substr(colon + 1);
    }
    bool is_attention = role == "attention";
    if (!is_attention && role != "ffn")
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("--instances {}: the role is 'attention' or 'ffn'", value));
    std::set<int>& ranks = is_attention ? attention : ffn;
    int count = is_attention ? config.job.attention : config.job.ffn;
    if (list.empty()) {
      all(ranks, count);
      continue;
    }
    while (!list.empty()) {
      auto comma = list.find(',');
      std::string_view item = list.substr(0, comma);
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      auto dash = item.find('-');
      int first = parse_rank(item.substr(0, dash), value);
      int last = dash == std::string_view::npos ? first : parse_rank(item.substr(dash + 1), value);
      if (last < first || last >= count)
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    fmt::format("--instances {}: the job has {} {} instance(s), ranks 0..{}", value,
                                count, is_attention ? "attention" : "ffn", count - 1));
      for (int r = first; r <= last; ++r)
        ranks.insert(r);
    }
  }
  return {{attention.begin(), attention.end()}, {ffn.begin(), ffn.end()}};
}

JobStore::JobStore(const JobConfig& config, const std::string& join) {
  if (!join.empty()) {
    address_ = join;
    return;
  }
  server_ = std::make_unique<TcpStoreServer>(config.rendezvous.address);
  address_ = server_->address();
}

}  // namespace hetmesh::afd
