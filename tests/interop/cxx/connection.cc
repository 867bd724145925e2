// What ps-lite's test_connection does (start a cluster, finalize it), plus
// checks every node makes of its membership. Ours, against ps-lite's public
// API; built and run by tests/interop/cxx_pslite.py.
//
//   connection      every node: Start(0), check role, cluster size, rank
//                   and id, print a line, Finalize(0, true)
#include "common.h"

int main(int argc, char* argv[]) {
  ps::Start(0);
  interop::CheckMembership();
  printf("connection: %s (node %d) joined a cluster of %d servers and %d workers\n",
         interop::Me().c_str(), ps::Postoffice::Get()->van()->my_node().id, ps::NumServers(),
         ps::NumWorkers());
  fflush(stdout);
  std::string me = interop::Me();
  ps::Finalize(0, true);
  printf("connection: %s finalized\n", me.c_str());
  return 0;
}
