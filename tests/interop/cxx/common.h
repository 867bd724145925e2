// Helpers shared by the C++ ps-lite programs in this folder (ours, written
// against ps-lite's public headers; built and run by tests/interop/cxx_pslite.py).
#ifndef PSLITE_INTEROP_CXX_COMMON_H_
#define PSLITE_INTEROP_CXX_COMMON_H_

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ps/ps.h"

namespace interop {

// The role this process was started as, from DMLC_ROLE.
inline std::string RoleFromEnv() {
  const char* role = getenv("DMLC_ROLE");
  return role ? role : "";
}

// A count from the environment (DMLC_NUM_SERVER, DMLC_NUM_WORKER).
inline int CountFromEnv(const char* name) {
  const char* value = getenv(name);
  CHECK(value) << name << " is not set";
  return atoi(value);
}

// "scheduler", "server 1", "worker 0": this node, for the lines it prints.
inline std::string Me() {
  if (ps::IsScheduler()) return "scheduler";
  return std::string(ps::IsServer() ? "server " : "worker ") + std::to_string(ps::MyRank());
}

// Checks what every node can check of itself once the cluster formed: its
// role is the one it was started as, the cluster has the size the
// environment gives, and its id is the one its role and rank imply
// (scheduler 1, server rank r 8+2r, worker rank r 9+2r).
inline void CheckMembership() {
  std::string role = RoleFromEnv();
  CHECK_EQ(ps::IsScheduler(), role == "scheduler") << "DMLC_ROLE=" << role;
  CHECK_EQ(ps::IsServer(), role == "server") << "DMLC_ROLE=" << role;
  CHECK_EQ(ps::IsWorker(), role == "worker") << "DMLC_ROLE=" << role;
  CHECK_EQ(ps::NumServers(), CountFromEnv("DMLC_NUM_SERVER"));
  CHECK_EQ(ps::NumWorkers(), CountFromEnv("DMLC_NUM_WORKER"));
  int id = ps::Postoffice::Get()->van()->my_node().id;
  if (ps::IsScheduler()) {
    CHECK_EQ(id, ps::kScheduler);
    return;
  }
  int rank = ps::MyRank();
  int of = ps::IsServer() ? ps::NumServers() : ps::NumWorkers();
  CHECK(rank >= 0 && rank < of) << "rank " << rank << " of " << of;
  int expected = ps::IsServer() ? ps::Postoffice::ServerRankToID(rank)
                                : ps::Postoffice::WorkerRankToID(rank);
  CHECK_EQ(id, expected) << "rank " << rank;
}

// Every node of the job: what ps::Start's own barrier waits for.
const int kEveryone = ps::kScheduler + ps::kServerGroup + ps::kWorkerGroup;

}  // namespace interop

#endif  // PSLITE_INTEROP_CXX_COMMON_H_
