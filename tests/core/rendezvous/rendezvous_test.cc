// The rendezvous store: the TCP store's operations, blocking gets across threads and processes,
// the reusable barrier, Rendezvous across real processes (2A2F), a store that dies, and a store
// fed malformed frames.
//
// Its tests are in the files beside this one, a subject each; this file is the binary's main and
// the helper processes it doubles as:
//   rendezvous_test --serve-store               hosts a store, prints "ADDRESS <host:port>", and
//                                               runs until its stdin closes
//   rendezvous_test --serve-store-out-of-threads   likewise, then caps its own address space
//                                               (RLIMIT_AS) just above what it uses, so that no
//                                               thread can start (a stack needs more); "raise" on
//                                               stdin lifts the cap again ("RAISED x")
//   rendezvous_test --set <address> <key> <value>   waits for "go" on stdin, then sets the key
//   rendezvous_test --instance <address> <job> <role> <rank>   one instance of a 2A2F rendezvous
//   rendezvous_test --own <address> <key>       sets the key as its own, then waits to be killed
#include "rendezvous_support.hpp"

#include <gtest/gtest.h>

#include <pthread.h>
#include <sys/resource.h>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace hetmesh {
namespace {

using namespace rendezvous_test;

int serve_store() {
  TcpStoreServer server("127.0.0.1:0");
  std::cout << "ADDRESS " << server.address() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

// This process's address space in bytes (VmSize), or 0.
uint64_t address_space_bytes() {
  std::ifstream status("/proc/self/status");
  std::string word;
  while (status >> word)
    if (word == "VmSize:") {
      uint64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
  return 0;
}

// A store whose host runs out of threads the way `ulimit -v` makes it: a real RLIMIT_AS, set once
// the store runs (its own threads need the room), half a thread's stack above what the
// process uses, so small allocations still succeed but pthread_create cannot map a stack. A
// connection of its own, held to the end and never used, runs the store's first opening before
// the cap: OpenSSL sets up its random generator in the gate's thread then, which needs more room
// than the cap leaves (and a connection that asks nothing starts no worker).
int serve_store_out_of_threads() {
  TcpStoreServer server("127.0.0.1:0");
  auto warm = connect_tcp_store(server.address(), kWait);
  pthread_attr_t attr;
  size_t stack = 0;
  if (pthread_getattr_default_np(&attr) != 0 || pthread_attr_getstacksize(&attr, &stack) != 0 ||
      stack == 0)
    return 2;
  pthread_attr_destroy(&attr);
  rlimit before{};
  const uint64_t used = address_space_bytes();
  if (used == 0 || getrlimit(RLIMIT_AS, &before) != 0) return 2;
  rlimit capped = before;
  capped.rlim_cur = used + stack / 2;
  if (setrlimit(RLIMIT_AS, &capped) != 0) return 2;
  std::cout << "ADDRESS " << server.address() << std::endl;
  std::string line;
  while (std::getline(std::cin, line))
    if (line == "raise") {
      if (setrlimit(RLIMIT_AS, &before) != 0) return 2;
      std::cout << "RAISED x" << std::endl;
    }
  return 0;
}

int set_when_told(const std::string& address, const std::string& key, const std::string& value) {
  auto store = connect_spec(address);
  std::cout << "CONNECTED x" << std::endl;
  std::string line;
  if (!std::getline(std::cin, line) || line != "go") return 2;
  store->set(key, bytes(value));
  return 0;
}

// Sets `key` as this process's own and "job/shared" as a job key, says "SET", then waits to be
// killed.
int own_and_wait(const std::string& spec, const std::string& key) {
  auto store = connect_spec(spec);
  store->own_keys(key);
  store->set(key, bytes("mine"));
  store->set("job/shared", bytes("the job's"));
  std::cout << "SET x" << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

// One instance of a 2A2F job: publishes its endpoint, waits for the world, checks every peer's
// endpoint, meets the others at a barrier twice, and leaves.
int run_instance(const std::string& address, const std::string& job, const std::string& role,
                 int rank) {
  try {
    auto store = connect_spec(address);
    Rendezvous rendezvous(*store, job, role, rank);
    rendezvous.publish("endpoint", bytes(endpoint_of(role, rank)));
    rendezvous.wait_for_world(2, 2, kWait);
    for (const char* peer_role : {"attention", "ffn"})
      for (int peer = 0; peer < 2; ++peer)
        if (rendezvous.fetch(peer_role, peer, "endpoint", kWait) !=
            bytes(endpoint_of(peer_role, peer))) {
          std::cerr << role << rank << ": wrong endpoint for " << peer_role << peer << "\n";
          return 1;
        }
    barrier(*store, job + "/fetched", 4, kWait);
    barrier(*store, job + "/fetched", 4, kWait);
    rendezvous.leave();
    std::cout << "OK " << role << " " << rank << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << role << rank << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace
}  // namespace hetmesh

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && args[0] == "--serve-store") return hetmesh::serve_store();
  if (args.size() == 1 && args[0] == "--serve-store-out-of-threads")
    return hetmesh::serve_store_out_of_threads();
  if (args.size() == 4 && args[0] == "--set")
    return hetmesh::set_when_told(args[1], args[2], args[3]);
  if (args.size() == 3 && args[0] == "--own") return hetmesh::own_and_wait(args[1], args[2]);
  if (args.size() == 5 && args[0] == "--instance")
    return hetmesh::run_instance(args[1], args[2], args[3], std::stoi(args[4]));
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
