// The job's secret (shared design §9): the credential every process of one job holds and nobody
// else does. The store's connections prove it (an HMAC challenge-response, store_wire.hpp) before
// any request is read. A launcher makes one per job and hands it to its children in a 0600 file
// named by HETMESH_JOB_SECRET_FILE (never on a command line, which every local user can read); a
// job across hosts names the file in its config ([rendezvous] secret_file).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

// Fills `out` with random bytes (OpenSSL's RAND_bytes): nonces.
void random_bytes(std::span<uint8_t> out);

class JobSecret {
 public:
  static constexpr size_t kBytes = 32;
  using Mac = std::array<uint8_t, 32>;  // HMAC-SHA256
  // The environment variable that names the secret's file for a launcher's children.
  static constexpr const char* kFileVariable = "HETMESH_JOB_SECRET_FILE";

  // A new random secret (OpenSSL's RAND_bytes).
  static JobSecret generate();
  // The secret in `path`: 64 hex digits (a newline may follow), in a regular file that only its
  // owner may read. Throws Error(INVALID_ARGUMENT) naming the file and what is wrong with it.
  static JobSecret read_file(const std::string& path);
  // The file kFileVariable names, if it is set.
  static std::optional<JobSecret> from_environment();
  // Writes it to a new file `path` with mode 0600 (refusing an existing one).
  void write_file(const std::string& path) const;

  // HMAC-SHA256 under the secret of `label`, then `a`, then `b`.
  Mac mac(std::string_view label, std::span<const uint8_t> a, std::span<const uint8_t> b) const;
  // Compares two MACs in constant time.
  static bool same(const Mac& x, const Mac& y);

  // For a store or listener that only serves this host's loopback without a secret: a fixed
  // key, which proves nothing and keeps one code path.
  static JobSecret none();
  bool is_none() const { return none_; }

 private:
  std::array<uint8_t, kBytes> key_{};
  bool none_ = false;
};

}  // namespace hetmesh

#pragma GCC visibility pop
