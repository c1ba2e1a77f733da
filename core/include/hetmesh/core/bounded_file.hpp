// Reading a file a user names (a job's config, a secret's file): the one way hetmesh reads such a
// file. It is opened without blocking (O_NONBLOCK: a FIFO's open would wait for a writer),
// checked to be a regular file (never a FIFO, a device such as /dev/zero, a folder or a socket),
// and read up to a cap, so a wrong path is an error at once, never a hang or memory used up.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

// The contents of the regular file `path`, at most `max_bytes` of them. Throws
// Error(HM_ERR_INVALID_ARGUMENT), `what` naming the file's role ("config", "job secret file"):
//   cannot read <what> <path>: <reason>                  (missing, unreadable, ...)
//   <what> <path> is a FIFO, not a regular file          (a character device, a directory, ...)
//   <what> <path> is N bytes; the most hetmesh reads is M
std::string read_bounded_file(const std::string& path, std::string_view what, size_t max_bytes);

}  // namespace hetmesh

#pragma GCC visibility pop
