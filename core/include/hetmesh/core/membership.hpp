// Incarnations: an instance of a job (a role and a rank) may be started again while the job runs,
// to replace one that died. Each start is a new epoch of that instance: 1 for the first, then 2,
// 3... Everything an incarnation publishes is kept under its epoch, so a peer never pairs one
// incarnation's endpoint with another's regions, and each replacement is announced in the job's
// member log, which the running instances follow to connect to it. Traffic of an older epoch than
// the current one is refused by its peers (the AFD wire header carries the epoch).
//
// Keys, beside Rendezvous's "<job>/<role>/<rank>/<what>":
//   <job>/<role>/<rank>/epochs       counter: the last epoch claimed
//   <job>/<role>/<rank>/epoch        the current epoch (decimal), set once its blobs are published
//   <job>/<role>/<rank>/e<N>/<what>  what epoch N published
//   <job>/members                    counter: replacements announced
//   <job>/members/<n>                the n-th replacement (n from 1): "<role> <rank> <epoch>"
#pragma once

#include <hetmesh/core/rendezvous.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

struct Incarnation {
  std::string role;  // "attention" or "ffn"
  int rank = 0;
  uint64_t epoch = 0;
};

// One instance's membership of a job.
class Membership {
 public:
  // role is "attention" or "ffn"; job_id non-empty and free of '/' (as for Rendezvous).
  Membership(KeyValueStore& store, std::string job_id, std::string role, int rank);

  // Claims this instance's next epoch, publishes `blobs` under it, then makes it the current one.
  // A replacement (epoch > 1) is then announced in the member log, and its predecessor's blobs
  // are erased. Returns the epoch.
  uint64_t join(const std::map<std::string, std::vector<uint8_t>>& blobs);

  // Another instance's current epoch, waiting for it to join (watching the job's failure, as
  // wait_for_key does).
  uint64_t current_epoch(const std::string& role, int rank, std::chrono::milliseconds timeout);
  // The last epoch another instance claimed (0 if none), without waiting: a start that claimed
  // one may still be publishing it, or may have died before it could.
  uint64_t claimed_epoch(const std::string& role, int rank);
  // What epoch `epoch` of that instance published as `what`, waiting for it likewise.
  std::vector<uint8_t> fetch(const std::string& role, int rank, uint64_t epoch,
                             const std::string& what, std::chrono::milliseconds timeout);

  const std::string& job_id() const { return rendezvous_.job_id(); }

 private:
  KeyValueStore& store_;
  Rendezvous rendezvous_;  // checks the identity; builds the keys
};

// Follows a job's member log from its start: each replacement, in the order announced.
class MemberWatch {
 public:
  // `patience`: how long an entry that was claimed but never written (its instance died between
  // the two steps) may hold up the ones after it before it is skipped.
  MemberWatch(KeyValueStore& store, std::string job_id, std::chrono::milliseconds patience);

  // The next announcement, waiting up to `timeout` for it; nullopt if none came. An entry that is
  // not "<attention|ffn> <rank> <epoch>" with epoch >= 2 is skipped with a warning: the store's
  // bytes are checked like any peer's.
  std::optional<Incarnation> next(std::chrono::milliseconds timeout);

 private:
  KeyValueStore& store_;
  std::string job_id_;
  std::chrono::milliseconds patience_;
  int64_t seen_ = 0;  // entries consumed
  std::optional<std::chrono::steady_clock::time_point> missing_since_;
};

// "attention 1 2" as an Incarnation, or nullopt if it is not exactly that shape (a role, a rank in
// 0..2^31, an epoch in 2..2^63).
std::optional<Incarnation> parse_member_entry(const std::string& text);

}  // namespace hetmesh

#pragma GCC visibility pop
