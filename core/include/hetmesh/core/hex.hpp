// The hex codec every text form of binary data uses (descriptors in JSON, IPC handles on a command
// line, endpoints on a pipe): bytes encode to lowercase hex, two digits a byte.
#pragma once

#include <hetmesh/core/error.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

// Lowercase hex, two digits a byte.
std::string to_hex(std::span<const uint8_t> bytes);

// Decodes hex. Both cases are accepted (hex digits are case-insensitive; only the encoder picks
// one). Odd length or a character that is not a hex digit throws Error(status) with a message
// that starts with `what`, the field being decoded ("region descriptor's 'handle'").
std::vector<uint8_t> from_hex(std::string_view text, std::string_view what,
                              hm_status status = HM_ERR_INVALID_ARGUMENT);
// Decodes exactly out.size() bytes: any other length is an error too.
void from_hex(std::string_view text, std::span<uint8_t> out, std::string_view what,
              hm_status status = HM_ERR_INVALID_ARGUMENT);

}  // namespace hetmesh

#pragma GCC visibility pop
