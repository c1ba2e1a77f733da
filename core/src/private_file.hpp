// Credentials kept in files (a job's secret, a password for etcd): read only from a regular file
// that nobody but its owner, this user, may read, so that a secret never sits on a command line
// or in a file another local user can open.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace hetmesh {

// The contents of `path`, at most `max_bytes` of them (more is an error), without one trailing
// newline, read as read_bounded_file reads (bounded_file.hpp). Throws Error(INVALID_ARGUMENT)
// naming `what` and the path: missing, not a regular file (a symbolic link is not followed),
// readable by others, another user's, or too long.
std::string read_private_file(const std::string& path, std::string_view what, size_t max_bytes);

}  // namespace hetmesh
