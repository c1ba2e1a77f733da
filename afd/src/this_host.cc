// Whether an address is this machine's (this_host.hpp).
#include "this_host.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/socket.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstring>
#include <vector>

namespace hetmesh::afd {

bool is_this_host(const std::string& host) {
  std::vector<net::Address> addresses;
  try {
    addresses = net::resolve(host + ":0", /*passive=*/false, "[hosts] address");
  } catch (const Error&) {
    return false;
  }
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return false;
  bool mine = false;
  for (const net::Address& a : addresses) {
    const sockaddr* sa = a.get();
    if (net::is_loopback(a)) mine = true;
    if (sa->sa_family == AF_INET &&
        reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr == htonl(INADDR_ANY))
      mine = true;
    if (sa->sa_family == AF_INET6 &&
        IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr))
      mine = true;
    for (ifaddrs* i = interfaces; i && !mine; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != sa->sa_family) continue;
      if (sa->sa_family == AF_INET)
        mine = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr ==
               reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr;
      else if (sa->sa_family == AF_INET6)
        mine = std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                           &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr,
                           sizeof(in6_addr)) == 0;
    }
  }
  freeifaddrs(interfaces);
  return mine;
}

}  // namespace hetmesh::afd
