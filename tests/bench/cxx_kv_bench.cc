// kv_bench's workloads written against C++ ps-lite (dmlc/ps-lite), so the
// two libraries are timed doing the same thing under the same launcher.
// Ours (not ps-lite's code); built and run by tests/bench/summary.py.
//
//   cxx_kv_bench cxx [KEYS] [ROUNDS]   push then pull KEYS keys (f32
//       values), ROUNDS times, a fresh value array per push made before the
//       timer starts (as kv_bench's cxx_fresh); prints
//       "BENCH cxx_fresh keys=N push_ms=a,b,.. pull_ms=a,b,.."
//   cxx_kv_bench rtt                   2000 1-key pushes after a warm-up;
//       prints "BENCH sweep keys=1 push_us=MEDIAN"
//   cxx_kv_bench connection            ps-lite's test_connection (Start with
//       its barrier, Finalize with its barrier) on every node, each printing
//       "BENCH ready_us=T fds=N" past the start barrier (T: microseconds
//       since PSLITE_LAUNCH_UNIX_NS, set by `pslite launch`; N: descriptors
//       open) and "BENCH exit role=R rss_kb=M fds=N" before it returns (M:
//       peak resident memory), as kv_bench's `scale` part prints for pslite
//
// Servers answer on ps-lite's customer thread: an empty answer to a push,
// the request's keys and a slice of one kept zero array to a pull (as
// kv_bench's empty server). Keys are spread over the whole key space, so
// every server gets a share, as in kv_bench.
#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ps/ps.h"

using namespace ps;

namespace {

SArray<float> zeros;

void EmptyHandle(const KVMeta& meta, const KVPairs<float>& req, KVServer<float>* server) {
  KVPairs<float> res;
  if (meta.pull) {
    size_t n = req.keys.size();
    if (zeros.size() < n) zeros = SArray<float>(n, 0.0f);
    res.keys = req.keys;
    res.vals = zeros.segment(0, n);
  }
  server->Response(meta, res);
}

SArray<Key> SpreadKeys(size_t n) {
  SArray<Key> keys(n);
  Key step = kMaxKey / (n == 0 ? 1 : n);
  for (size_t i = 0; i < n; ++i) keys[i] = i * step;
  return keys;
}

double Since(std::chrono::steady_clock::time_point t, double unit) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() * unit;
}

std::string Join(const std::vector<double>& v) {
  std::string out;
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    snprintf(buf, sizeof(buf), "%s%.3f", i ? "," : "", v[i]);
    out += buf;
  }
  return out;
}

int Workload(KVWorker<float>* kv, size_t n, int rounds) {
  SArray<Key> keys = SpreadKeys(n);
  // Values made before the timer starts: one fresh array per push.
  std::vector<SArray<float>> fresh;
  for (int r = 0; r < rounds; ++r) fresh.push_back(SArray<float>(n, r + 2.0f));
  Postoffice::Get()->Barrier(0, kWorkerGroup);
  std::vector<double> push, pull;
  for (int r = 0; r < rounds; ++r) {
    auto t = std::chrono::steady_clock::now();
    kv->Wait(kv->ZPush(keys, fresh[r]));
    push.push_back(Since(t, 1e3));
    SArray<float> got;
    t = std::chrono::steady_clock::now();
    kv->Wait(kv->ZPull(keys, &got));
    pull.push_back(Since(t, 1e3));
    if (got.size() != n) {
      fprintf(stderr, "pulled %zu values, expected %zu\n", got.size(), n);
      return 1;
    }
  }
  printf("BENCH cxx_fresh keys=%zu push_ms=%s pull_ms=%s\n", n, Join(push).c_str(),
         Join(pull).c_str());
  return 0;
}

int RoundTrips(KVWorker<float>* kv) {
  const int iters = 2000;
  SArray<Key> keys = SpreadKeys(1);
  SArray<float> one(1, 1.0f);
  Postoffice::Get()->Barrier(0, kWorkerGroup);
  for (int i = 0; i < 20; ++i) {  // warm up connections and buffers
    kv->Wait(kv->ZPush(keys, one));
    SArray<float> got;
    kv->Wait(kv->ZPull(keys, &got));
  }
  std::vector<SArray<float>> fresh;
  for (int i = 0; i < iters; ++i) fresh.push_back(SArray<float>(1, i + 2.0f));
  Postoffice::Get()->Barrier(0, kWorkerGroup);
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    auto t = std::chrono::steady_clock::now();
    kv->Wait(kv->ZPush(keys, fresh[i]));
    us.push_back(Since(t, 1e6));
  }
  std::sort(us.begin(), us.end());
  printf("BENCH sweep keys=1 push_us=%.1f\n", us[us.size() / 2]);
  return 0;
}

// Descriptors this process has open.
int OpenDescriptors() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n - 3;  // ".", ".." and the directory's own
}

// Peak resident memory (VmHWM) in kB.
long PeakRssKb() {
  FILE* f = fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kb = -1;
  while (fgets(line, sizeof(line), f) != nullptr) {
    if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
  }
  fclose(f);
  return kb;
}

int Connection() {
  Start(0);
  const char* launched = getenv("PSLITE_LAUNCH_UNIX_NS");
  long long since = 0;
  if (launched != nullptr) {
    auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
    since = (now - atoll(launched)) / 1000;
  }
  printf("BENCH ready_us=%lld fds=%d\n", since, OpenDescriptors());
  fflush(stdout);
  const char* role = IsServer() ? "server" : IsWorker() ? "worker" : "scheduler";
  int fds = OpenDescriptors();
  Finalize(0, true);
  printf("BENCH exit role=%s rss_kb=%ld fds=%d\n", role, PeakRssKb(), fds);
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  std::string mode = argc > 1 ? argv[1] : "cxx";
  size_t keys = argc > 2 ? strtoull(argv[2], nullptr, 10) : 10000000;
  int rounds = argc > 3 ? atoi(argv[3]) : 5;
  if (mode == "connection") return Connection();
  if (mode != "cxx" && mode != "rtt") {
    fprintf(stderr, "usage: %s cxx [KEYS] [ROUNDS] | rtt | connection\n", argv[0]);
    return 2;
  }
  Start(0);
  KVServer<float>* server = nullptr;
  if (IsServer()) {
    server = new KVServer<float>(0);
    server->set_request_handle(EmptyHandle);
  }
  // Every server's customer exists before a worker sends: C++ ps-lite's
  // receive thread waits at most 5 s for a customer, and a worker released
  // from Start's barrier first may send while the server's release is still
  // queued behind its request (the wait then blocks the release: abort).
  Postoffice::Get()->Barrier(0, kScheduler + kServerGroup + kWorkerGroup);
  int rc = 0;
  if (IsWorker()) {
    KVWorker<float> kv(0, 0);
    rc = mode == "cxx" ? Workload(&kv, keys, rounds) : RoundTrips(&kv);
    fflush(stdout);
  }
  Finalize(0, true);
  delete server;
  return rc;
}
