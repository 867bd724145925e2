// What ps-lite's test_kv_app does: servers hold a sum store
// (KVServerDefaultHandle<float>); each worker pushes its 10 000 keys 50
// times (at most 10 pushes in flight), pulls them, then push-pulls them 50
// times, and checks the values: the pull reads 50 times what it pushed, the
// last push-pull 100 times. A worker's keys are its own (spread over the
// whole key space, so every server has a share, and offset by the rank), so
// other workers' pushes never mix in. Ours, against ps-lite's public API;
// built and run by tests/interop/cxx_pslite.py.
//
//   kv_app [late]
//       late: create the server's KVServer after ps::Start, as ps-lite's
//       test_kv_app does. That races inside C++ ps-lite: a worker released
//       from the start barrier before a server (a C++ scheduler releases
//       the workers first) may push before the server read its own
//       release, and the server's receive thread then waits for the
//       KVServer (5 s, then aborts: "timeout (5 sec) to wait App 0
//       customer 0") while the release it needs sits behind that request;
//       or the push lands between the KVServer's creation and its
//       set_request_handle ("Check failed: request_handle_"). Without
//       `late` the server registers its KVServer between StartAsync and
//       the start barrier, as MXNet does, and no request can come first.
#include <cmath>
#include <cstdlib>
#include <vector>

#include "common.h"

namespace {

const int kKeys = 10000;
const int kRounds = 50;
const int kInFlight = 10;

ps::KVServer<float>* StartServer() {
  auto* server = new ps::KVServer<float>(0);
  server->set_request_handle(ps::KVServerDefaultHandle<float>());
  return server;
}

// The largest difference between got[i] and times * vals[i].
float Error(const std::vector<float>& got, const std::vector<float>& vals, int times) {
  CHECK_EQ(got.size(), vals.size());
  float worst = 0;
  for (size_t i = 0; i < vals.size(); ++i) {
    worst = std::max(worst, std::fabs(got[i] - vals[i] * times));
  }
  return worst;
}

void RunWorker() {
  ps::KVWorker<float> kv(0, 0);
  int rank = ps::MyRank();
  std::vector<ps::Key> keys(kKeys);
  std::vector<float> vals(kKeys);
  srand(rank + 7);
  for (int i = 0; i < kKeys; ++i) {
    keys[i] = ps::kMaxKey / kKeys * i + rank;
    vals[i] = rand() % 1000;
  }
  std::vector<int> pushes;
  for (int i = 0; i < kRounds; ++i) {
    pushes.push_back(kv.Push(keys, vals));
    if (pushes.size() > kInFlight) kv.Wait(pushes[pushes.size() - 1 - kInFlight]);
  }
  for (int ts : pushes) kv.Wait(ts);

  std::vector<float> pulled;
  kv.Wait(kv.Pull(keys, &pulled));
  float pull_error = Error(pulled, vals, kRounds);

  std::vector<float> outs;
  for (int i = 0; i < kRounds; ++i) kv.Wait(kv.PushPull(keys, vals, &outs));
  float push_pull_error = Error(outs, vals, 2 * kRounds);

  // Sums of integers below 2^24 are exact in f32.
  CHECK_EQ(pull_error, 0) << "pulled values differ from " << kRounds << " pushes";
  CHECK_EQ(push_pull_error, 0) << "push-pulled values differ from " << 2 * kRounds << " pushes";
  printf("kv_app: worker %d: %d keys pushed %d times and push-pulled %d times: exact\n", rank,
         kKeys, kRounds, kRounds);
}

}  // namespace

int main(int argc, char* argv[]) {
  bool late = argc > 1 && std::string(argv[1]) == "late";
  if (argc > 1 && !late) {
    fprintf(stderr, "usage: %s [late]\n", argv[0]);
    return 2;
  }
  ps::KVServer<float>* server = nullptr;
  if (late) {
    ps::Start(0);
    if (ps::IsServer()) server = StartServer();
  } else {
    ps::StartAsync(0);
    if (ps::IsServer()) server = StartServer();
    ps::Postoffice::Get()->Barrier(0, interop::kEveryone);
  }
  interop::CheckMembership();
  if (ps::IsWorker()) RunWorker();
  ps::Finalize(0, true);
  delete server;
  return 0;
}
