// Engine — the kernels' thread pool: workers made once and woken per call (making threads on
// every call costs more than a small product), the calling thread working beside them.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels.h"

namespace tiny_llm {
namespace {

struct Job {
  const std::function<void(int)>* f;
  int n;
  std::atomic<int> next{0}, done{0};
};

// A worker takes tasks of the newest job until none is left; a worker that wakes after the
// job ended finds its counter past the end and does nothing with it.
static void run_tasks(Job& job) {
  for (int i; (i = job.next.fetch_add(1)) < job.n;) {
    (*job.f)(i);
    job.done.fetch_add(1, std::memory_order_release);
  }
}

// How long an idle worker watches for work before it sleeps: $TINY_LLM_SPIN_US, else 100 us.
long spin_microseconds() {
  if (const char* env = std::getenv("TINY_LLM_SPIN_US")) return std::max(0L, std::atol(env));
  return 100;
}

class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int n, const std::function<void(int)>& f) {
    if (n <= 1 || workers_.empty()) {
      for (int i = 0; i < n; ++i) f(i);
      return;
    }
    auto job = std::make_shared<Job>();
    job->f = &f;
    job->n = n;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = job;
      generation_.fetch_add(1, std::memory_order_release);
    }
    if (sleeping_.load(std::memory_order_acquire) > 0) wake_.notify_all();
    run_tasks(*job);
    while (job->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
  }

 private:
  void work() {
    long seen = 0;
    for (;;) {
      // The next product of a forward pass usually follows within microseconds: watch for it
      // a little while before sleeping (waking a sleeping thread costs tens of microseconds).
      const auto until = std::chrono::steady_clock::now() + spin_;
      while (generation_.load(std::memory_order_acquire) == seen && !stop_.load(std::memory_order_relaxed) &&
             std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        sleeping_.fetch_add(1);
        wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
        sleeping_.fetch_sub(1);
        if (stop_) return;
        seen = generation_.load();
        job = job_;
      }
      run_tasks(*job);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::shared_ptr<Job> job_;
  std::atomic<long> generation_{0};
  std::atomic<int> sleeping_{0};
  std::atomic<bool> stop_{false};
  std::chrono::microseconds spin_{spin_microseconds()};
};

int default_threads() {
  if (const char* env = std::getenv("TINY_LLM_THREADS")) {
    int n = std::atoi(env);
    if (n >= 1) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

std::mutex pool_mutex;
std::unique_ptr<Pool> pool;

Pool& get_pool() {
  std::lock_guard<std::mutex> lock(pool_mutex);
  if (!pool) pool = std::make_unique<Pool>(default_threads());
  return *pool;
}

}  // namespace

int num_threads() { return get_pool().size(); }

void set_num_threads(int n) {
  if (n < 1) throw std::invalid_argument("threads must be at least 1, got " + std::to_string(n));
  std::lock_guard<std::mutex> lock(pool_mutex);
  pool.reset();
  pool = std::make_unique<Pool>(n);
}

void parallel_for(int n, const std::function<void(int)>& f) { get_pool().run(n, f); }

}  // namespace tiny_llm
