#include "private_file.hpp"

#include <hetmesh/core/error.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace hetmesh {

std::string read_private_file(const std::string& path, std::string_view what, size_t max_bytes) {
  auto bad = [&](const std::string& why) {
    return Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{} {}: {}", what, path, why));
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) throw bad(std::strerror(errno));
  struct stat st {};
  std::vector<char> text(max_bytes + 2);  // room for a newline, and one byte to see "too long"
  ssize_t n = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 077) == 0 &&
      st.st_uid == ::geteuid())
    n = ::read(fd, text.data(), text.size());
  ::close(fd);
  if (!S_ISREG(st.st_mode)) throw bad("not a regular file");
  if ((st.st_mode & 077) != 0)
    throw bad(fmt::format("mode {:o}: others may read it (chmod 600 it)", st.st_mode & 0777));
  if (st.st_uid != ::geteuid()) throw bad("owned by another user");
  if (n < 0) throw bad(std::strerror(errno));
  size_t length = static_cast<size_t>(n);
  if (length > 0 && text[length - 1] == '\n') --length;
  if (length > max_bytes) throw bad(fmt::format("longer than {} bytes", max_bytes));
  return std::string(text.data(), length);
}

}  // namespace hetmesh
