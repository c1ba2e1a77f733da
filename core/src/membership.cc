// Epochs of a job's instances and the member log that announces replacements (membership.hpp).
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/membership.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

namespace hetmesh {

using std::chrono::milliseconds;

namespace {

std::string epoch_key(uint64_t epoch, const std::string& what) {
  return fmt::format("e{}/{}", epoch, what);
}

std::string member_key(const std::string& job_id, int64_t n) {
  return fmt::format("{}/members/{}", job_id, n);
}

// A decimal number filling all of `text`, or nullopt.
template <typename T>
std::optional<T> whole_number(std::string_view text) {
  T value{};
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

}  // namespace

std::optional<Incarnation> parse_member_entry(const std::string& text) {
  auto first = text.find(' ');
  auto second = first == std::string::npos ? first : text.find(' ', first + 1);
  if (second == std::string::npos) return std::nullopt;
  Incarnation who{text.substr(0, first), 0, 0};
  auto rank = whole_number<int>(std::string_view(text).substr(first + 1, second - first - 1));
  auto epoch = whole_number<uint64_t>(std::string_view(text).substr(second + 1));
  if ((who.role != "attention" && who.role != "ffn") || !rank || *rank < 0 || !epoch ||
      *epoch < 2 || *epoch > (uint64_t{1} << 63))
    return std::nullopt;
  who.rank = *rank;
  who.epoch = *epoch;
  return who;
}

Membership::Membership(KeyValueStore& store, std::string job_id, std::string role, int rank)
    : store_(store), rendezvous_(store, std::move(job_id), std::move(role), rank) {}

uint64_t Membership::join(const std::map<std::string, std::vector<uint8_t>>& blobs) {
  const std::string& role = rendezvous_.role();
  const int rank = rendezvous_.rank();
  const auto epoch = static_cast<uint64_t>(store_.add(rendezvous_.key(role, rank, "epochs"), 1));
  // This incarnation's blobs die with it (a store with leases deletes them); the epoch counter
  // and the pointer to the current epoch outlive it, for its replacement.
  store_.own_keys(rendezvous_.key(role, rank, epoch_key(epoch, "")));
  for (const auto& [what, blob] : blobs)
    rendezvous_.publish(epoch_key(epoch, what), blob);
  // Current only once complete: a peer that reads the epoch finds everything it published.
  std::string text = std::to_string(epoch);
  rendezvous_.publish("epoch", {text.begin(), text.end()});
  if (epoch > 1) {
    const std::string& job = rendezvous_.job_id();
    int64_t n = store_.add(job + "/members", 1);
    std::string entry = fmt::format("{} {} {}", role, rank, epoch);
    store_.set(member_key(job, n), {entry.begin(), entry.end()});
    for (const auto& [what, blob] : blobs)
      store_.erase(rendezvous_.key(role, rank, epoch_key(epoch - 1, what)));
  }
  return epoch;
}

uint64_t Membership::current_epoch(const std::string& role, int rank, milliseconds timeout) {
  auto text = rendezvous_.fetch(role, rank, "epoch", timeout);
  auto epoch = whole_number<uint64_t>(
      std::string_view(reinterpret_cast<const char*>(text.data()), text.size()));
  if (!epoch || *epoch == 0)
    throw Error(kStatusProtocolError,
                fmt::format("{}: {} {} published a malformed epoch ({} bytes)", store_.describe(),
                            role, rank, text.size()));
  return *epoch;
}

uint64_t Membership::claimed_epoch(const std::string& role, int rank) {
  return static_cast<uint64_t>(
      std::max<int64_t>(0, store_.add(rendezvous_.key(role, rank, "epochs"), 0)));
}

std::vector<uint8_t> Membership::fetch(const std::string& role, int rank, uint64_t epoch,
                                       const std::string& what, milliseconds timeout) {
  return rendezvous_.fetch(role, rank, epoch_key(epoch, what), timeout);
}

MemberWatch::MemberWatch(KeyValueStore& store, std::string job_id, milliseconds patience)
    : store_(store), job_id_(std::move(job_id)), patience_(patience) {}

std::optional<Incarnation> MemberWatch::next(milliseconds timeout) {
  const std::string key = member_key(job_id_, seen_ + 1);
  std::vector<uint8_t> entry;
  try {
    entry = store_.get(key, timeout);
  } catch (const Error& e) {
    if (e.status() != HM_ERR_TIMEOUT) throw;
    // Missing: none announced yet, or claimed by an instance that died before writing it. Only
    // the second holds up later entries, and only until the patience runs out.
    if (store_.add(job_id_ + "/members", 0) <= seen_) return std::nullopt;
    auto now = std::chrono::steady_clock::now();
    if (!missing_since_) missing_since_ = now;
    if (now - *missing_since_ < patience_) return std::nullopt;
    log(LogLevel::warn, "{}: member log entry {} was claimed but never written; skipped",
        store_.describe(), seen_ + 1);
    ++seen_;
    missing_since_.reset();
    return std::nullopt;
  }
  ++seen_;
  missing_since_.reset();
  auto who = parse_member_entry(std::string(entry.begin(), entry.end()));
  if (!who)
    log(LogLevel::warn, "{}: member log entry {} is malformed ({} bytes); skipped",
        store_.describe(), seen_, entry.size());
  return who;
}

}  // namespace hetmesh
