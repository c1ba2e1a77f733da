// The metrics registry's exposition (core/metrics.hpp) and the endpoint that serves it
// (core/metrics_server.hpp), scraped over real HTTP on loopback, with and without the token.
#include <hetmesh/core/metrics.hpp>
#include <hetmesh/core/metrics_server.hpp>
#include <hetmesh/core/socket.hpp>

#include "test_support.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <string>
#include <thread>

namespace hetmesh::metrics {
namespace {

using std::chrono::milliseconds;

using test::error_of;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(Metrics, RendersEachKindInTheTextFormat) {
  Registry r(Labels{{"role", "ffn"}, {"rank", "1"}});
  r.counter("hm_bytes_total", "Bytes.", {{"peer", "attention 0"}, {"direction", "sent"}}).add(5);
  r.counter("hm_bytes_total", "Bytes.", {{"peer", "attention 0"}, {"direction", "sent"}}).add(2);
  r.gauge("hm_up", "Up.").set(1);
  Histogram& h = r.histogram("hm_wait_seconds", "Waits.", {}, std::vector<double>{1e-6, 1e-3});
  h.observe_ns(1000);        // on the bound: counted in it
  h.observe_ns(2000);        // in (1 us, 1 ms]
  h.observe_ns(-5);          // clocks that disagree: 0
  h.observe_ns(20'000'000);  // +Inf
  EXPECT_EQ(r.render(),
            "# HELP hm_bytes_total Bytes.\n"
            "# TYPE hm_bytes_total counter\n"
            "hm_bytes_total{role=\"ffn\",rank=\"1\",peer=\"attention 0\",direction=\"sent\"} 7\n"
            "# HELP hm_up Up.\n"
            "# TYPE hm_up gauge\n"
            "hm_up{role=\"ffn\",rank=\"1\"} 1\n"
            "# HELP hm_wait_seconds Waits.\n"
            "# TYPE hm_wait_seconds histogram\n"
            "hm_wait_seconds_bucket{role=\"ffn\",rank=\"1\",le=\"1e-06\"} 2\n"
            "hm_wait_seconds_bucket{role=\"ffn\",rank=\"1\",le=\"0.001\"} 3\n"
            "hm_wait_seconds_bucket{role=\"ffn\",rank=\"1\",le=\"+Inf\"} 4\n"
            "hm_wait_seconds_sum{role=\"ffn\",rank=\"1\"} 0.020003\n"
            "hm_wait_seconds_count{role=\"ffn\",rank=\"1\"} 4\n");
}

TEST(Metrics, EscapesLabelValuesAndHelp) {
  Registry r;
  r.gauge("hm_g", "a \\ b\nc", {{"why", "say \"no\"\nnow \\"}}).set(0.5);
  EXPECT_EQ(r.render(),
            "# HELP hm_g a \\\\ b\\nc\n# TYPE hm_g gauge\n"
            "hm_g{why=\"say \\\"no\\\"\\nnow \\\\\"} 0.5\n");
}

TEST(Metrics, RefusesWhatPrometheusWouldNot) {
  Registry r;
  error_of([&] { r.counter("hm_bytes", "no _total"); }, HM_ERR_INVALID_ARGUMENT);
  error_of([&] { r.gauge("hm_up_total", "a gauge named as a counter"); }, HM_ERR_INVALID_ARGUMENT);
  error_of([&] { r.gauge("9lives", "starts with a digit"); }, HM_ERR_INVALID_ARGUMENT);
  error_of([&] { r.gauge("hm_x", "bad label", {{"peer-name", "x"}}); }, HM_ERR_INVALID_ARGUMENT);
  error_of(
      [&] {
        r.histogram("hm_h_seconds", "le is the buckets'", {{"le", "1"}});
      },
      HM_ERR_INVALID_ARGUMENT);
  error_of(
      [&] {
        r.histogram("hm_h_seconds", "unsorted", {}, std::vector<double>{1, 0.5});
      },
      HM_ERR_INVALID_ARGUMENT);
  r.gauge("hm_kind", "a gauge");
  EXPECT_THAT(error_of([&] { r.histogram("hm_kind", "now a histogram"); }, HM_ERR_INVALID_ARGUMENT),
              HasSubstr("'hm_kind' is a gauge, not a histogram"));
  error_of([] { Registry bad(Labels{{"__name__", "x"}}); }, HM_ERR_INVALID_ARGUMENT);
}

TEST(Metrics, RefreshersRunAtEachScrape) {
  Registry r;
  int scrapes = 0;
  r.on_scrape([&] { r.gauge("hm_scrapes", "Scrapes so far.").set(++scrapes); });
  EXPECT_THAT(r.render(), HasSubstr("hm_scrapes 1\n"));
  EXPECT_THAT(r.render(), HasSubstr("hm_scrapes 2\n"));
}

TEST(Metrics, CountersAddUpAcrossThreads) {
  Registry r;
  Counter& c = r.counter("hm_n_total", "N.");
  Histogram& h = r.histogram("hm_t_seconds", "T.");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.add();
        h.observe_ns(i);
      }
    });
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(c.value(), 40000u);
  EXPECT_EQ(h.snapshot().cumulative.back(), 40000u);
}

// All the endpoint sends until it closes the connection (or resets it), within 5 s.
std::string read_to_close(const net::Fd& fd) {
  const net::Deadline deadline = net::Clock::now() + milliseconds(5000);
  std::string response;
  char chunk[4096];
  try {
    while (size_t n = net::recv_some(fd.get(), chunk, sizeof chunk, "the response", deadline))
      response.append(chunk, n);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), kStatusPeerLost) << e.what();  // a reset: the server closed unread data
  }
  return response;
}

// One HTTP exchange with the endpoint at `address`: `request` as given, the whole response back.
std::string http_exchange(const std::string& address, const std::string& request) {
  net::Fd fd = net::connect_with_retry(net::resolve(address, false, "metrics"), milliseconds(2000),
                                       milliseconds(10), "metrics");
  net::send_all(fd.get(), request.data(), request.size(), "request");
  return read_to_close(fd);
}

std::string http_get(const std::string& address, const std::string& path,
                     const std::string& headers = "") {
  return http_exchange(
      address, "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + "\r\n");
}

TEST(MetricsServer, ServesTheRegistryOnLoopback) {
  Registry r(Labels{{"role", "attention"}});
  r.counter("hm_round_trips_total", "Round trips.").add(3);
  Server server(r, "127.0.0.1:0", nullptr, "attention 0's metrics");
  ASSERT_TRUE(server.address().starts_with("127.0.0.1:")) << server.address();
  const std::string ok = http_get(server.address(), "/metrics");
  EXPECT_TRUE(ok.starts_with("HTTP/1.1 200")) << ok;
  EXPECT_THAT(ok, HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(ok, HasSubstr("hm_round_trips_total{role=\"attention\"} 3\n"));
  EXPECT_TRUE(http_get(server.address(), "/").starts_with("HTTP/1.1 404"));
  EXPECT_TRUE(http_exchange(server.address(),
                            "POST /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                  .starts_with("HTTP/1.1 405"));
}

TEST(MetricsServer, BeyondLoopbackNeedsTheJobSecret) {
  Registry r;
  EXPECT_THAT(error_of([&] { Server s(r, "0.0.0.0:0", nullptr, "ffn 1's metrics"); },
                       HM_ERR_INVALID_ARGUMENT),
              HasSubstr("ffn 1's metrics ([metrics] listen): 0.0.0.0:0 is beyond loopback"));
  const JobSecret none = JobSecret::none();
  error_of([&] { Server s(r, "0.0.0.0:0", &none, "x"); }, HM_ERR_INVALID_ARGUMENT);
}

TEST(MetricsServer, BeyondLoopbackAScrapeWithoutTheTokenIsRefused) {
  Registry r;
  r.gauge("hm_up", "Up.").set(1);
  const JobSecret secret = JobSecret::generate();
  Server server(r, "0.0.0.0:0", &secret, "ffn 1's metrics");
  const std::string port = server.address().substr(server.address().rfind(':'));
  const std::string at = "127.0.0.1" + port;
  const std::string token = metrics_token(secret);
  ASSERT_EQ(token.size(), 64u);
  EXPECT_NE(token, metrics_token(JobSecret::generate()));

  const std::string none = http_get(at, "/metrics");
  EXPECT_TRUE(none.starts_with("HTTP/1.1 401")) << none;
  EXPECT_THAT(none, HasSubstr("WWW-Authenticate: Bearer"));
  EXPECT_THAT(none, Not(HasSubstr("hm_up")));
  const std::string wrong = token.substr(0, 63) + (token[63] == '0' ? "1" : "0");
  EXPECT_TRUE(http_get(at, "/metrics", "Authorization: Bearer " + wrong + "\r\n")
                  .starts_with("HTTP/1.1 401"));
  EXPECT_TRUE(http_get(at, "/metrics", "Authorization: Bearer " + token + "x\r\n")
                  .starts_with("HTTP/1.1 401"));
  // Not even a 404 says what is there without the token.
  EXPECT_TRUE(http_get(at, "/elsewhere").starts_with("HTTP/1.1 401"));
  const std::string ok = http_get(at, "/metrics", "Authorization: Bearer " + token + "\r\n");
  EXPECT_TRUE(ok.starts_with("HTTP/1.1 200")) << ok;
  EXPECT_THAT(ok, HasSubstr("hm_up 1\n"));
}

TEST(MetricsServer, SilentClientsDelayNoScrape) {
  Registry r;
  r.gauge("hm_up", "Up.").set(1);
  Server server(r, "127.0.0.1:0", nullptr, "metrics");
  std::vector<net::Fd> silent;  // connected, half a request line, then nothing
  for (int i = 0; i < 8; ++i) {
    silent.push_back(net::connect_with_retry(net::resolve(server.address(), false, "m"),
                                             milliseconds(2000), milliseconds(10), "m"));
    net::send_all(silent.back().get(), "GET /met", 8, "half a request");
  }
  EXPECT_THAT(http_get(server.address(), "/metrics"), HasSubstr("hm_up 1\n"));
}

TEST(MetricsServer, AnOversizedRequestIsRefusedAndTheNextScrapeServed) {
  Registry r;
  r.gauge("hm_up", "Up.").set(1);
  Server server(r, "127.0.0.1:0", nullptr, "metrics");
  net::Fd fd = net::connect_with_retry(net::resolve(server.address(), false, "metrics"),
                                       milliseconds(2000), milliseconds(10), "metrics");
  const std::string huge =
      "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Filler: " + std::string(size_t{1} << 20, 'a') +
      "\r\n\r\n";
  try {  // the server may stop reading and close before all of it is sent
    net::send_all(fd.get(), huge.data(), huge.size(), "an oversized request",
                  net::Clock::now() + milliseconds(5000));
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), kStatusPeerLost) << e.what();
  }
  const std::string refusal = read_to_close(fd);
  EXPECT_FALSE(refusal.starts_with("HTTP/1.1 200")) << refusal.substr(0, 200);
  EXPECT_THAT(refusal, Not(HasSubstr("hm_up")));
  EXPECT_THAT(http_get(server.address(), "/metrics"), HasSubstr("hm_up 1\n"));
}

TEST(MetricsServer, AnAddressInUseIsNamed) {
  Registry r;
  Server first(r, "127.0.0.1:0", nullptr, "attention 0's metrics");
  const std::string e =
      error_of([&] { Server second(r, first.address(), nullptr, "ffn 0's metrics"); },
               HM_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(e, HasSubstr("ffn 0's metrics ([metrics] listen)"));
  EXPECT_THAT(e, HasSubstr("in use"));
}

}  // namespace
}  // namespace hetmesh::metrics
