// The job secret: generating, storing, reading and MACs (job_secret.hpp), through OpenSSL's
// libcrypto.
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/hex.hpp>
#include <hetmesh/core/job_secret.hpp>

#include "private_file.hpp"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace hetmesh {

void random_bytes(std::span<uint8_t> out) {
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1)
    throw Error(HM_ERR_INTERNAL, "OpenSSL's RAND_bytes failed");
}

JobSecret JobSecret::generate() {
  JobSecret s;
  random_bytes(s.key_);
  return s;
}

JobSecret JobSecret::none() {
  JobSecret s;
  s.none_ = true;
  return s;
}

JobSecret JobSecret::read_file(const std::string& path) {
  const std::string text = read_private_file(path, "job secret file", 4096);
  if (text.size() != kBytes * 2)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("job secret file {}: expected {} hex digits", path, kBytes * 2));
  JobSecret s;
  from_hex(text, s.key_, fmt::format("job secret file {}", path));
  return s;
}

std::optional<JobSecret> JobSecret::from_environment() {
  const char* path = std::getenv(kFileVariable);
  if (path == nullptr || *path == '\0') return std::nullopt;
  return read_file(path);
}

void JobSecret::write_file(const std::string& path) const {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("job secret file {}: {}", path, std::strerror(errno)));
  std::string text = to_hex(key_) + "\n";
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ok = ::close(fd) == 0 && ok;
  if (!ok)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("job secret file {}: cannot write it: {}", path, std::strerror(errno)));
}

JobSecret::Mac JobSecret::mac(std::string_view label, std::span<const uint8_t> a,
                              std::span<const uint8_t> b) const {
  Mac out{};
  unsigned length = 0;
  std::vector<uint8_t> message(label.begin(), label.end());
  message.insert(message.end(), a.begin(), a.end());
  message.insert(message.end(), b.begin(), b.end());
  if (HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()), message.data(), message.size(),
           out.data(), &length) == nullptr ||
      length != out.size())
    throw Error(HM_ERR_INTERNAL, "job secret: OpenSSL's HMAC failed");
  return out;
}

bool JobSecret::same(const Mac& x, const Mac& y) {
  return CRYPTO_memcmp(x.data(), y.data(), x.size()) == 0;
}

}  // namespace hetmesh
