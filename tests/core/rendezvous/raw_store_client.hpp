// A raw connection to the TCP store, for the tests that send what a real client never would.
#pragma once

#include <hetmesh/core/job_secret.hpp>

#include "rendezvous_support.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>
#include <string>

namespace hetmesh::rendezvous_test {

class RawClient {
 public:
  explicit RawClient(const std::string& address) {
    size_t colon = address.rfind(':');
    sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
    inet_pton(AF_INET, address.substr(0, colon).c_str(), &in.sin_addr);
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&in), sizeof in), 0) << std::strerror(errno);
  }
  ~RawClient() { close(fd_); }
  // The client's half of the store's challenge-response, by hand: true if the store accepted
  // `secret`. `client_label` is what the client MACs (the protocol's own label, unless a test
  // forges another).
  bool prove(const JobSecret& secret, const std::string& client_label = "hetmesh store client") {
    Bytes challenge(40), answer(72), verdict(33);
    if (!receive(challenge)) return false;
    std::copy(challenge.begin(), challenge.begin() + 8, answer.begin());
    for (size_t i = 0; i < 32; ++i)
      answer[8 + i] = static_cast<uint8_t>(i * 7 + 3);
    JobSecret::Mac mac = secret.mac(client_label, std::span(challenge).subspan(8, 32),
                                    std::span(answer).subspan(8, 32));
    std::copy(mac.begin(), mac.end(), answer.begin() + 40);
    send_bytes(answer);
    return receive(verdict) && verdict[0] == 0;
  }
  bool receive(Bytes& out) {
    size_t got = 0;
    while (got < out.size()) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(kWait.count())) <= 0) return false;
      ssize_t n = recv(fd_, out.data() + got, out.size() - got, 0);
      if (n <= 0) return false;
      got += static_cast<size_t>(n);
    }
    return true;
  }
  void send_bytes(const Bytes& data) {
    EXPECT_EQ(send(fd_, data.data(), data.size(), MSG_NOSIGNAL), static_cast<ssize_t>(data.size()));
  }
  // Whether the server closed the connection within the limit (reading and dropping any data).
  bool closed_by_peer(milliseconds limit) {
    auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char buffer[256];
      ssize_t n = recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) return true;
    }
    return false;
  }

 private:
  int fd_ = -1;
};

// A request header as the protocol lays it out (little-endian): magic "HMKV", version, op, zero,
// key length, value length.
inline Bytes header(uint32_t magic, uint8_t version, uint8_t op, uint32_t key_length,
                    uint32_t value_length) {
  Bytes out(16, 0);
  for (int i = 0; i < 4; ++i) {
    out[i] = static_cast<uint8_t>(magic >> (8 * i));
    out[8 + i] = static_cast<uint8_t>(key_length >> (8 * i));
    out[12 + i] = static_cast<uint8_t>(value_length >> (8 * i));
  }
  out[4] = version;
  out[5] = op;
  return out;
}

}  // namespace hetmesh::rendezvous_test
