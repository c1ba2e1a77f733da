// The library's threads (hetmesh/core/thread.hpp): one whose code lets an exception out ends alone,
// naming itself in an error line, where std::thread would have called std::terminate and ended the
// application (as a bench's thread out of memory once did: "terminate called after throwing an
// instance of 'std::bad_alloc'").
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/thread.hpp>

#include <gtest/gtest.h>

#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace hetmesh {
namespace {

struct ErrorLines {
  std::mutex mutex;
  std::vector<std::string> lines;
  LogSink previous;
  ErrorLines() {
    previous = set_log_sink([this](LogLevel level, std::string_view line) {
      std::lock_guard lock(mutex);
      if (level == LogLevel::error) lines.emplace_back(line);
    });
  }
  ~ErrorLines() { set_log_sink(previous); }
};

TEST(StartThread, AnExceptionItsCodeLetsOutEndsTheThreadNamedNeverTheProcess) {
  ErrorLines errors;
  std::thread failing = start_thread("hm-test-throw", [] { throw std::runtime_error("no luck"); });
  failing.join();
  std::thread starved = start_thread("hm-test-oom", [] { throw std::bad_alloc(); });
  starved.join();
  std::thread odd = start_thread("hm-test-odd", [] { throw 42; });
  odd.join();
  ASSERT_EQ(errors.lines.size(), 3u);
  EXPECT_NE(errors.lines[0].find("thread hm-test-throw ended on an error its code did not handle: "
                                 "no luck"),
            std::string::npos)
      << errors.lines[0];
  EXPECT_NE(errors.lines[1].find("thread hm-test-oom ended"), std::string::npos) << errors.lines[1];
  EXPECT_NE(errors.lines[1].find("bad_alloc"), std::string::npos) << errors.lines[1];
  EXPECT_NE(errors.lines[2].find("not a std::exception"), std::string::npos) << errors.lines[2];
}

TEST(StartThread, ItsNameIsWhatToolsShow) {
  std::string seen;
  std::thread named = start_thread("hm-test-name", [&] {
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof name);
    seen = name;
  });
  named.join();
  EXPECT_EQ(seen, "hm-test-name");
}

}  // namespace
}  // namespace hetmesh
