// Engine — the kernels' thread pool: workers made once and woken per call (making threads on
// every call costs more than a small product), the calling thread working beside them.
#include <atomic>
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
      ++generation_;
    }
    wake_.notify_all();
    run_tasks(*job);
    while (job->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
  }

 private:
  void work() {
    long seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      run_tasks(*job);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::shared_ptr<Job> job_;
  long generation_ = 0;
  bool stop_ = false;
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
