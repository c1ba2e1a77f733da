// Refusing, before anything starts, what this machine cannot run (job.hpp): a memory estimate
// against the memory available, and a usable folder for the job's files.
#include <hetmesh/afd/job.hpp>
#include <hetmesh/core/error.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string_view>

namespace hetmesh::afd {
namespace {

namespace fs = std::filesystem;

// Devices whose plugin allocates in host memory.
bool host_backed(const std::string& selector) {
  std::string_view name = std::string_view(selector).substr(0, selector.find(':'));
  return name == "cpu" || name == "asic_stub";
}

// The value of `key` ("MemAvailable:") in /proc/meminfo, in bytes.
std::optional<uint64_t> meminfo(std::string_view key) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  uint64_t kib = 0;
  std::string unit;
  while (in >> name >> kib >> unit)
    if (name == key) return kib * 1024;
  return std::nullopt;
}

std::optional<uint64_t> read_number(const char* path) {
  std::ifstream in(path);
  uint64_t value = 0;
  if (in >> value) return value;
  return std::nullopt;  // also "max"
}

}  // namespace

double engine_host_bytes(const JobConfig& c, Role role, int rank) {
  EngineSpec spec = job_shape(c, role, rank);
  const std::string& device = role == Role::attention
                                  ? c.devices.attention.at(static_cast<size_t>(rank))
                                  : c.devices.ffn.at(static_cast<size_t>(rank));
  double peers = role == Role::attention ? c.job.ffn : c.job.attention;
  double headers = 2.0 * 128 * c.job.micro_batches * peers;
  return headers + (host_backed(device) ? static_cast<double>(spec.instance_slot_bytes()) : 0.0);
}

uint64_t available_memory_bytes(std::string* source) {
  uint64_t available = 0;
  if (auto bytes = meminfo("MemAvailable:")) {
    available = *bytes;
    if (source) *source = "MemAvailable in /proc/meminfo";
  } else {
    available = static_cast<uint64_t>(sysconf(_SC_AVPHYS_PAGES)) *
                static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (source) *source = "free pages";
  }
  auto limit = read_number("/sys/fs/cgroup/memory.max");
  auto used = read_number("/sys/fs/cgroup/memory.current");
  if (limit && used && *limit > *used && *limit - *used < available) {
    available = *limit - *used;
    if (source) *source = "the cgroup's memory.max less memory.current";
  }
  return available;
}

std::string format_bytes(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024)
    return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024 * 1024));
  if (bytes >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024));
  return fmt::format("{:.0f} KiB", bytes / 1024.0);
}

void refuse_unless_memory_fits(const std::vector<MemoryNeed>& needs, const std::string& config_name,
                               const std::string& advice) {
  double total = 0;
  std::string parts;
  for (const MemoryNeed& need : needs) {
    total += need.bytes;
    parts +=
        fmt::format("{}{}: {}", parts.empty() ? "" : "; ", need.what, format_bytes(need.bytes));
  }
  std::string source;
  uint64_t available = available_memory_bytes(&source);
  if (total <= static_cast<double>(available)) return;
  throw Error(HM_ERR_OUT_OF_MEMORY,
              fmt::format("{}: this job needs about {} of memory on this machine ({}), but only {} "
                          "is available ({}); {}",
                          config_name, format_bytes(total), parts,
                          format_bytes(static_cast<double>(available)), source, advice));
}

fs::path make_job_folder(const std::string& prefix) {
  const char* variable = nullptr;
  const char* value = nullptr;
  for (const char* name : {"TMPDIR", "TMP", "TEMP", "TEMPDIR"})  // as temp_directory_path
    if (const char* v = std::getenv(name); v && *v) {
      variable = name, value = v;
      break;
    }
  fs::path base = value ? fs::path(value) : fs::path("/tmp");
  std::string origin = variable ? fmt::format(" (from {}={})", variable, value) : "";
  std::error_code ec;
  if (!fs::is_directory(base, ec))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("the temporary folder {}{} {}; set {} to an existing folder you can "
                            "write to (e.g. {}=/tmp)",
                            base.string(), origin,
                            fs::exists(base, ec) ? "is not a folder" : "does not exist",
                            variable ? variable : "TMPDIR", variable ? variable : "TMPDIR"));
  // A new folder every time (mkdtemp), never one left by a killed process whose pid came back.
  std::string dir = (base / fmt::format("{}-{}-XXXXXX", prefix, getpid())).string();
  if (::mkdtemp(dir.data()) == nullptr) {
    int err = errno;
    throw Error(
        HM_ERR_INVALID_ARGUMENT,
        fmt::format("cannot create {} in the temporary folder {}{}: {}; set {} to a folder "
                    "you can write to (e.g. {}=/tmp)",
                    fs::path(dir).filename().string(), base.string(), origin, std::strerror(err),
                    variable ? variable : "TMPDIR", variable ? variable : "TMPDIR"));
  }
  return dir;
}

}  // namespace hetmesh::afd
