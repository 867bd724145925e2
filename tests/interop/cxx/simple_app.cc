// What ps-lite's test_simple_app does: one node sends 100 SimpleApp
// requests (head 1, body "test") to a group, every member checks head and
// body and answers, and each counts what it received. Ours, against
// ps-lite's public API; built and run by tests/interop/cxx_pslite.py.
//
//   simple_app [scheduler|worker]
//       the requester: the scheduler (as ps-lite's test; its group is every
//       node, itself included) or worker rank 0 (its group is the servers:
//       for a job whose scheduler is not this program; C++ ps-lite opens
//       no connection between workers). Every member checks it handled 100
//       requests; the requester that it got 100 answers from each member,
//       each echoing head 1.
//
// The app exists and has its handles before the start barrier (StartAsync,
// then the app, then the barrier, as MXNet does): with ps::Start first, a
// request reaching a node between the app's creation and its handle is
// answered by SimpleApp's default handle and never counted.
#include <atomic>
#include <vector>

#include "common.h"

namespace {

const int kRequests = 100;
const int kHead = 1;
const char kBody[] = "test";

std::atomic<int> handled(0);
std::atomic<int> answers(0);

void OnRequest(const ps::SimpleData& req, ps::SimpleApp* app) {
  CHECK_EQ(req.head, kHead);
  CHECK_EQ(req.body, kBody);
  // Counted before the answer leaves: once the requester has every answer,
  // every member has counted every request.
  ++handled;
  app->Response(req);
}

void OnAnswer(const ps::SimpleData& res, ps::SimpleApp* app) {
  CHECK_EQ(res.head, kHead);
  ++answers;
}

}  // namespace

int main(int argc, char* argv[]) {
  std::string from = argc > 1 ? argv[1] : "scheduler";
  if (from != "scheduler" && from != "worker") {
    fprintf(stderr, "usage: %s [scheduler|worker]\n", argv[0]);
    return 2;
  }
  ps::StartAsync(0);
  ps::SimpleApp app(0, 0);
  app.set_request_handle(OnRequest);
  app.set_response_handle(OnAnswer);
  ps::Postoffice::Get()->Barrier(0, interop::kEveryone);
  interop::CheckMembership();

  int group = from == "scheduler" ? interop::kEveryone : ps::kServerGroup;
  bool requester = from == "scheduler" ? ps::IsScheduler() : ps::IsWorker() && ps::MyRank() == 0;
  bool member = from == "scheduler" || ps::IsServer();
  int members = static_cast<int>(ps::Postoffice::Get()->GetNodeIDs(group).size());
  if (requester) {
    std::vector<int> sent;
    for (int i = 0; i < kRequests; ++i) sent.push_back(app.Request(kHead, kBody, group));
    for (int ts : sent) app.Wait(ts);
  }
  std::string me = interop::Me();
  // Every request was handled before its answer left, and the requester
  // waited for every answer before this barrier.
  ps::Finalize(0, true);
  CHECK_EQ(handled.load(), member ? kRequests : 0) << me;
  if (requester) CHECK_EQ(answers.load(), kRequests * members) << me;
  printf("simple_app: %s handled %d requests%s\n", me.c_str(), handled.load(),
         requester ? (", got " + std::to_string(answers.load()) + " answers").c_str() : "");
  return 0;
}
