// Child processes (subprocess.hpp): started with fork and exec so that each one dies with its
// parent, their pipes, and waiting for them with a deadline.
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <thread>
#include <utility>

extern char** environ;

namespace hetmesh {

std::string ProcessResult::describe() const {
  if (timed_out) return "timed out and was killed";
  if (signal != 0) return fmt::format("signal {} ({})", signal, strsignal(signal));
  return fmt::format("exit code {}", exit_code);
}

std::string self_executable() {
  char buffer[4096];
  ssize_t n = readlink("/proc/self/exe", buffer, sizeof buffer - 1);
  if (n <= 0) return {};
  return std::string(buffer, static_cast<size_t>(n));
}

namespace {

// A one-way channel. stdin uses a socket pair so writing to a child that already exited gives
// EPIPE (send with MSG_NOSIGNAL) instead of a SIGPIPE that would kill this process.
struct Pipe {
  int read = -1, write = -1;
  // `program` and `what` name it in an error: "starting hetmesh: creating its stdout pipe: ...".
  Pipe(const std::string& program, const char* what, bool socket = false) {
    int fds[2];
    int rc =
        socket ? socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) : pipe2(fds, O_CLOEXEC);
    if (rc != 0)
      throw Error(HM_ERR_BACKEND, fmt::format("starting {}: creating its {}: {}", program, what,
                                              describe_errno(errno)));
    read = fds[0];
    write = fds[1];
  }
  ~Pipe() {
    if (read >= 0) close(read);
    if (write >= 0) close(write);
  }
  void close_read() { close(read), read = -1; }
  void close_write() { close(write), write = -1; }
};

// In the child, between fork and exec: only async-signal-safe calls. Never returns.
[[noreturn]] void exec_child(char* const* args, const int (&fds)[3], pid_t parent, int report) {
  // Dies with the parent. A parent that died before prctl took effect is seen as a new parent.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);  // a mask would survive exec
  for (int target = 0; target < 3; ++target) {
    if (fds[target] < 0) continue;
    if (fds[target] == target)
      fcntl(target, F_SETFD, 0);  // dup2 to itself would keep close-on-exec
    else if (dup2(fds[target], target) < 0)
      break;
  }
  execve(args[0], args, environ);
  int error = errno;
  ssize_t ignored = ::write(report, &error, sizeof error);
  (void)ignored;
  _exit(127);
}

// Starts argv[0] (a path) with `fds` as its stdin, stdout and stderr (-1: this process's).
// Throws Error(INVALID_ARGUMENT) if it cannot be started, e.g. a missing executable.
pid_t spawn(const std::vector<std::string>& argv, const int (&fds)[3]) {
  std::vector<char*> args;
  for (const auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  Pipe report(argv[0], "exec report pipe");  // close-on-exec: stays silent when exec succeeds,
                                             // carries errno when it fails
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0)
    throw Error(HM_ERR_BACKEND,
                fmt::format("starting {}: fork: {}", argv[0], describe_errno(errno)));
  if (pid == 0) exec_child(args.data(), fds, parent, report.write);
  report.close_write();
  int error = 0;
  ssize_t got;
  while ((got = ::read(report.read, &error, sizeof error)) < 0 && errno == EINTR) {
  }
  if (got <= 0) return pid;
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  throw Error(HM_ERR_INVALID_ARGUMENT,
              fmt::format("cannot start {}: {}", argv[0], std::strerror(error)));
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                          const std::string& input) {
  if (argv.empty()) throw Error(HM_ERR_INVALID_ARGUMENT, "run_process: empty argv");
  Pipe in(argv[0], "stdin socket", /*socket=*/true), out(argv[0], "stdout pipe"),
      err(argv[0], "stderr pipe");
  pid_t pid = spawn(argv, {in.read, out.write, err.write});
  in.close_read();
  out.close_write();
  err.close_write();

  ProcessResult result;
  size_t written = 0;
  if (input.empty()) in.close_write();
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (out.read >= 0 || err.read >= 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd fds[3] = {{out.read, POLLIN, 0}, {err.read, POLLIN, 0}, {in.write, POLLOUT, 0}};
    int n = poll(fds, 3, static_cast<int>(std::min<int64_t>(left.count(), 100)));
    if (n < 0 && errno != EINTR) break;
    char buffer[4096];
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t got = read(fds[i].fd, buffer, sizeof buffer);
      if (got > 0) {
        (i == 0 ? result.out : result.err).append(buffer, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        (i == 0 ? out : err).close_read();
      }
    }
    if (fds[2].fd >= 0 && (fds[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t put = send(in.write, input.data() + written, input.size() - written, MSG_NOSIGNAL);
      if (put > 0) written += static_cast<size_t>(put);
      if (put < 0 || written == input.size()) in.close_write();
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!result.timed_out) {
    if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
    if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  }
  return result;
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv) {
  if (argv.empty()) throw Error(HM_ERR_INVALID_ARGUMENT, "ChildProcess: empty argv");
  Pipe in(argv[0], "stdin socket", /*socket=*/true), out(argv[0], "stdout pipe");
  pid_ = spawn(argv, {in.read, out.write, -1});
  stdin_ = std::exchange(in.write, -1);
  stdout_ = std::exchange(out.read, -1);
}

ChildProcess::~ChildProcess() {
  if (!reaped_) {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (stdin_ >= 0) close(stdin_);
  if (stdout_ >= 0) close(stdout_);
}

void ChildProcess::write(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = send(stdin_, text.data() + done, text.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error(kStatusPeerLost,
                  fmt::format("child {} does not read its input: {}", pid_, std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
}

std::string ChildProcess::read_line(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (bool first = true;; first = false) {
    if (size_t nl = buffered_.find('\n'); nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    // Rounded up, and polled at least once: a short timeout (1 ms) must still see what is there.
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 && !first)
      throw Error(HM_ERR_TIMEOUT,
                  fmt::format("child {} printed no line within {} ms", pid_, timeout.count()));
    pollfd p{stdout_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0))) <= 0) continue;
    char buffer[4096];
    ssize_t n = read(stdout_, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(kStatusPeerLost, fmt::format("child {} closed its output", pid_));
    buffered_.append(buffer, static_cast<size_t>(n));
  }
}

void ChildProcess::kill(int signal) {
  if (!reaped_) ::kill(pid_, signal);
}

ProcessResult ChildProcess::wait(std::chrono::milliseconds timeout) {
  ProcessResult result;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      result.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  reaped_ = true;
  if (!result.timed_out) {
    if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
    if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  }
  return result;
}

}  // namespace hetmesh
