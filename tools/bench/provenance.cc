#include "provenance.hpp"

#include <unistd.h>

#include <ctime>

namespace hetmesh::cli {

nlohmann::json provenance() {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return {{"host", host}, {"date", date}, {"hetmesh_version", HETMESH_VERSION}};
}

}  // namespace hetmesh::cli
