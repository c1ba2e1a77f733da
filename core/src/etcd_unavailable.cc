// connect_etcd_store for a build without libcurl (rendezvous.hpp): etcd is refused, saying why.
#include <hetmesh/core/rendezvous.hpp>

namespace hetmesh {

std::unique_ptr<KeyValueStore> connect_etcd_store(const EtcdOptions& options,
                                                  std::chrono::milliseconds) {
  throw Error(HM_ERR_NOT_SUPPORTED,
              "etcd store " + options.endpoint +
                  ": this hetmesh was built without libcurl (Debian libcurl4-openssl-dev), which "
                  "the etcd store needs");
}

}  // namespace hetmesh
