// Reproduces a defect of libfabric 1.17's shm provider (Debian 12), without hetmesh: a receiver
// whose sender is SIGKILLed at a random moment may spin for good inside fi_cq_read, in
// pthread_spin_lock on the lock of its own shared segment, which the dead sender held.
//
//   gcc -O2 -g -o shm_killed_peer libfabric_shm_killed_peer.c -lfabric && ./shm_killed_peer 1000
//
// Prints "no wedge in N rounds", or "WEDGED" and the receiver's stack (gdb), exit 7.
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(x)                                                \
  do {                                                          \
    int r_ = (int)(x);                                          \
    if (r_) {                                                   \
      fprintf(stderr, "%s: %d %s\n", #x, r_, fi_strerror(-r_)); \
      exit(1);                                                  \
    }                                                           \
  } while (0)

static struct fid_ep* ep;
static struct fid_cq* cq;
static struct fid_av* av;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void open_endpoint(const char* name) {
  struct fi_info *hints = fi_allocinfo(), *info;
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  hints->caps = FI_MSG;
  hints->ep_attr->type = FI_EP_RDM;
  hints->fabric_attr->prov_name = strdup("shm");
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->addr_format = FI_ADDR_STR;
  hints->src_addr = strdup(name);
  hints->src_addrlen = strlen(name) + 1;
  CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
  CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
  CHECK(fi_domain(fabric, info, &domain, NULL));
  CHECK(fi_endpoint(domain, info, &ep, NULL));
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_DATA, .size = 1024};
  struct fi_av_attr av_attr = {.type = FI_AV_MAP};
  CHECK(fi_cq_open(domain, &cq_attr, &cq, NULL));
  CHECK(fi_av_open(domain, &av_attr, &av, NULL));
  CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
  CHECK(fi_ep_bind(ep, &av->fid, 0));
  CHECK(fi_enable(ep));
}

static void wedged(int sig) {
  (void)sig;
  char command[160];
  snprintf(command, sizeof command,
           "gdb -p %d -batch -ex 'thread apply all bt' 2>/dev/null | grep -E '^#'", getpid());
  fprintf(stderr, "WEDGED: fi_cq_read did not return within 5 s\n");
  if (system(command) != 0) fprintf(stderr, "(no gdb for the stack)\n");
  _exit(7);
}

static char buffers[64][4096];

// The sender: 8-byte messages to `peer` as fast as the provider takes them, until killed.
static int send_forever(const char* peer) {
  char name[64];
  snprintf(name, sizeof name, "fi_shm://shm-killed-peer-B-%d", getpid());
  open_endpoint(name);
  fi_addr_t to;
  if (fi_av_insert(av, peer, 1, &to, 0, NULL) != 1) return 3;
  struct fi_cq_data_entry entries[16];
  for (;;) {
    (void)fi_send(ep, buffers[0], 8, NULL, to, NULL);
    (void)fi_cq_read(cq, entries, 16);
  }
}

int main(int argc, char** argv) {
  if (argc > 2) return send_forever(argv[2]);
  signal(SIGALRM, wedged);
  char name[64];
  snprintf(name, sizeof name, "fi_shm://shm-killed-peer-A-%d", getpid());
  open_endpoint(name);
  char address[256];
  size_t length = sizeof address;
  CHECK(fi_getname(&ep->fid, address, &length));
  for (long i = 0; i < 64; ++i)
    CHECK(fi_recv(ep, buffers[i], 4096, NULL, FI_ADDR_UNSPEC, (void*)i));
  const int rounds = argc > 1 ? atoi(argv[1]) : 1000;
  srand(getpid());
  long received = 0;
  for (int round = 0; round < rounds; ++round) {
    pid_t sender = fork();
    if (sender == 0) {
      execl("/proc/self/exe", argv[0], "send", address, (char*)NULL);
      _exit(9);
    }
    const double kill_at = now() + 0.2 + (rand() % 800) * 1e-3, end = kill_at + 0.2;
    int killed = 0;
    while (now() < end) {
      if (!killed && now() >= kill_at) killed = kill(sender, SIGKILL) == 0;
      struct fi_cq_data_entry entries[16];
      alarm(5);
      ssize_t n = fi_cq_read(cq, entries, 16);
      alarm(0);
      for (ssize_t i = 0; i < n; ++i, ++received)
        CHECK(fi_recv(ep, buffers[(long)entries[i].op_context], 4096, NULL, FI_ADDR_UNSPEC,
                      entries[i].op_context));
    }
    waitpid(sender, NULL, 0);
    if (round % 50 == 0) printf("round %d: %ld messages received\n", round, received);
  }
  printf("no wedge in %d rounds\n", rounds);
  return 0;
}
