// Reading files a user names (bounded_file.hpp) and credentials' files (private_file.hpp): one
// open, one type check, one capped read.
#include "private_file.hpp"

#include <hetmesh/core/bounded_file.hpp>
#include <hetmesh/core/error.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>

namespace hetmesh {
namespace {

// "a FIFO", "a directory", ... for what is not a regular file.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a file";
}

struct Descriptor {
  int fd;
  ~Descriptor() { ::close(fd); }
};

// Opens `path` without blocking and without following a last symbolic link unless `follow`,
// checks that it is a regular file of at most `max_bytes`, runs `check` on its status, and
// reads it.
std::string read_regular_file(const std::string& path, std::string_view what, size_t max_bytes,
                              bool follow, const std::function<void(const struct stat&)>& check) {
  auto bad = [&](const std::string& why) {
    return Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{} {} {}", what, path, why));
  };
  auto unreadable = [&](int error) {
    return Error(HM_ERR_INVALID_ARGUMENT,
                 fmt::format("cannot read {} {}: {}", what, path, std::strerror(error)));
  };
  const int fd =
      ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
  if (fd < 0) {
    const int error = errno;
    struct stat st {};
    if (error == ELOOP && !follow && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
      throw bad("is a symbolic link, which is not followed for it; name the file itself");
    if (error == ENXIO && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      throw bad(fmt::format("is {}, not a regular file", kind_of(st.st_mode)));  // a socket
    throw unreadable(error);
  }
  Descriptor owned{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw unreadable(errno);
  if (!S_ISREG(st.st_mode))
    throw bad(fmt::format("is {}, not a regular file", kind_of(st.st_mode)));
  auto too_big = [&](uint64_t bytes, bool at_least) {
    return bad(fmt::format("is {}{} bytes; the most hetmesh reads is {}",
                           at_least ? "more than " : "", bytes, max_bytes));
  };
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw too_big(static_cast<uint64_t>(st.st_size), false);
  if (check) check(st);
  // Read to the end, one byte past the cap: a file that grew since fstat (or one whose size the
  // kernel does not tell, as /proc's) is still held to it.
  std::string text(max_bytes + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw unreadable(errno);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes) throw too_big(max_bytes, true);
  text.resize(got);
  return text;
}

}  // namespace

std::string read_bounded_file(const std::string& path, std::string_view what, size_t max_bytes) {
  return read_regular_file(path, what, max_bytes, /*follow=*/true, {});
}

std::string read_private_file(const std::string& path, std::string_view what, size_t max_bytes) {
  auto bad = [&](const std::string& why) {
    return Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{} {}: {}", what, path, why));
  };
  // Room for a trailing newline.
  std::string text =
      read_regular_file(path, what, max_bytes + 1, /*follow=*/false, [&](const struct stat& st) {
        if ((st.st_mode & 077) != 0)
          throw bad(fmt::format("mode {:o}: others may read it (chmod 600 it)", st.st_mode & 0777));
        if (st.st_uid != ::geteuid()) throw bad("owned by another user");
      });
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (text.size() > max_bytes) throw bad(fmt::format("longer than {} bytes", max_bytes));
  return text;
}

}  // namespace hetmesh
