// TransportTest's control messages: many sent at once arrive, and are answered, in order.
#include "transport_support.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace hetmesh {
namespace {

using namespace transport_test;

TEST_P(TransportTest, ControlMessagesArriveInOrder) {
  for (int k = 0; k < 20; ++k) {
    std::string text = std::to_string(k);
    connection_->send_control({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  }
  std::vector<std::string> replies;
  auto deadline = std::chrono::steady_clock::now() + kWait;
  while (replies.size() < 20 && std::chrono::steady_clock::now() < deadline) {
    std::vector<TransportEvent> events;
    local_->transport->poll(events, std::chrono::milliseconds(100));
    for (const auto& e : events) {
      ASSERT_NE(e.type, TransportEvent::Type::peer_lost) << e.message;
      if (e.type == TransportEvent::Type::control)
        replies.emplace_back(e.payload.begin(), e.payload.end());
    }
  }
  ASSERT_EQ(replies.size(), 20u);
  for (int k = 0; k < 20; ++k)
    EXPECT_EQ(replies[k], "pong " + std::to_string(k));
}

}  // namespace
}  // namespace hetmesh
