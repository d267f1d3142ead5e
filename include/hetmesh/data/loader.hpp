// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: the runtime data plane of one process. It owns the source loaders (k_s per source, the
// only holders of each source's access state), plans steps with the pure planner, and keeps a worker
// pool reading `prefetch_steps` steps ahead. next() returns the steps in order. The stream is a pure
// function of (configuration, step): neither the number of workers, nor the loaders per source, nor
// the timing of reads changes a byte, which is what makes resume exact.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/ranges.h>

#include "../core/error.hpp"
#include "autoscale.hpp"
#include "memory_report.hpp"
#include "mixture.hpp"
#include "planner.hpp"
#include "source.hpp"

namespace hetmesh::data {

/// Settings of a data_loader: reading threads, read-ahead, loaders per source, autoscaling.
struct loader_options {
  int workers = 2;         ///< reading threads besides the caller (which reads too while it waits in next());
                           // 0: all reads on the caller's thread, inside next()
  int prefetch_steps = 2;  ///< steps planned and read ahead of the one next() returns
  int loaders_per_source = 1;  ///< initial k_s
  int chunk_samples = 64;      ///< samples per read task (fewer hand-offs between threads)
  /// The data-parallel ranks this data plane loads for (empty: all of them). A data plane scaled out over
  /// several processes (run/data_service.hpp) gives each a disjoint share: every process plans the whole
  /// step, and reads only its share, so no sample is read twice.
  std::vector<int> serve_dp{};
  autoscale_options autoscale{};  ///< how loaders per source follow the mixture
  friend bool operator==(const loader_options&, const loader_options&) = default;
};

/// One step as delivered: its plan and the loaded samples, samples[i] for plan.samples[i] (left empty
/// for samples of data-parallel ranks outside loader_options::serve_dp).
struct loaded_batch {
  batch_plan plan{};              ///< the step's data plan
  std::vector<sample> samples{};  ///< samples[i] is plan.samples[i]
};

/// The data plane of one process: plans every step (data::plan_step, balanced by the partitioner
/// `Split`, a balance::partitioner), reads its share of the samples through source loaders on a pool of
/// threads, ahead of time, and hands out one loaded_batch per next(). Deterministic: the samples of a step
/// depend only on the configuration, seed, partitioner and step. `data_loader` is the LPT one.
template <class Split>
class basic_data_loader {
  static_assert(balance::partitioner<Split>, "data::basic_data_loader: Split is not a balance::partitioner");

 public:
  /// Opens k_s = loaders_per_source loaders per source and starts the workers. Throws invalid_argument for
  /// a bad configuration and data_error for unreadable sources. Cost: opening every source k_s times.
  explicit basic_data_loader(mixture_config cfg, loader_options opts = {}, wds_decoder decode = {},
                             Split split = {})
      : cfg_(std::move(cfg)), opts_(opts), decode_(std::move(decode)), split_(std::move(split)) {
    validate(cfg_);
    if (opts_.workers < 0 || opts_.prefetch_steps < 0 || opts_.loaders_per_source < 1)
      throw_error<invalid_argument>(
          "data_loader: workers = {}, prefetch_steps = {}, loaders_per_source = {}; expected >= 0, >= 0, >= "
          "1",
          opts_.workers, opts_.prefetch_steps, opts_.loaders_per_source);
    served_.assign(static_cast<std::size_t>(cfg_.layout.dp_size()), opts_.serve_dp.empty() ? 1 : 0);
    for (int d : opts_.serve_dp) {
      if (d < 0 || d >= cfg_.layout.dp_size() || served_[static_cast<std::size_t>(d)] != 0)
        throw_error<invalid_argument>(
            "data_loader: serve_dp names {} (in [{}]); expected distinct data-parallel ranks in [0, {})", d,
            fmt::join(opts_.serve_dp, ", "), cfg_.layout.dp_size());
      served_[static_cast<std::size_t>(d)] = 1;
    }
    loaders_.resize(cfg_.sources.size());
    cost_ns_.assign(cfg_.sources.size(), 0.0);
    for (std::size_t s = 0; s < cfg_.sources.size(); ++s) {
      for (int j = 0; j < opts_.loaders_per_source; ++j) loaders_[s].push_back(open_loader(s));
      sizes_.push_back(loaders_[s].front()->size());
    }
    plan_state_ = consumed_ = initial_state(cfg_);
    for (int w = 0; w < opts_.workers; ++w) threads_.emplace_back([this] { work(); });
  }
  basic_data_loader(const basic_data_loader&) = delete;
  basic_data_loader& operator=(const basic_data_loader&) = delete;
  ~basic_data_loader() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  /// The next step's batch (blocking). Throws what planning or reading that step threw (data_error for a
  /// dry source or a corrupt sample), after having delivered every earlier step.
  [[nodiscard]] loaded_batch next() {
    fill();
    std::shared_ptr<slot> sl;
    {
      std::lock_guard lock(mutex_);
      sl = inflight_.front();
    }
    if (sl->plan_error) std::rethrow_exception(sl->plan_error);  // the slot stays: every later call fails too
    {
      // Wait for the step, helping with its reads meanwhile: the caller is a reader too (the only one
      // with workers = 0), so a pool never leaves a core idle while the step it waits for is unread.
      std::unique_lock lock(mutex_);
      while (sl->remaining != 0) {
        if (!tasks_.empty() && tasks_.front().sl == sl) {
          const task t = pop_task_locked();
          lock.unlock();
          run_task(t);
          lock.lock();
          continue;
        }
        done_cv_.wait(lock);
      }
      inflight_.pop_front();
    }
    // A read error leaves its (popped) slot before it is rethrown: a worker may drop the slot's last
    // reference later, and the exception must end on this thread (its count is invisible to ThreadSanitizer).
    if (sl->read_error) {
      std::exception_ptr e;
      {
        std::lock_guard lock(mutex_);
        e = std::exchange(sl->read_error, nullptr);
      }
      std::rethrow_exception(e);
    }
    consumed_ = sl->next_state;
    maybe_autoscale();
    return {std::move(sl->plan), std::move(sl->samples)};
  }

  /// Hands a consumed batch's buffers back for reuse by later reads (optional). Reusing buffers spares
  /// the allocator and the first-touch page faults of fresh memory on every sample; at most
  /// (prefetch_steps + 2) x global_batch samples are kept.
  void recycle(loaded_batch&& b) {
    std::lock_guard lock(mutex_);
    const auto cap = static_cast<std::size_t>((opts_.prefetch_steps + 2) * cfg_.global_batch);
    for (auto& s : b.samples) {
      if (spare_.size() >= cap) break;
      spare_.push_back(std::move(s));
    }
  }

  /// The state before the step next() returns next: the checkpoint.
  [[nodiscard]] planner_state state() const { return consumed_; }

  /// Continues from `st` (drops whatever was prefetched). Pre: st has one cursor per source.
  void restore(const planner_state& st) {
    if (st.cursors.size() != cfg_.sources.size())
      throw_error<mismatch_error>("data_loader::restore: state has {} cursors for {} sources",
                                  st.cursors.size(), cfg_.sources.size());
    validate_state(cfg_, st, "data_loader::restore: state");
    validate_positions(cfg_, st, sizes_, "data_loader::restore: state");
    std::unique_lock lock(mutex_);
    tasks_.clear();
    done_cv_.wait(lock, [&] { return active_ == 0; });
    inflight_.clear();
    plan_state_ = consumed_ = st;
  }

  /// The mixture configuration it plans with.
  [[nodiscard]] const mixture_config& config() const noexcept { return cfg_; }
  /// Loaders currently serving `source` (changes under autoscaling). Pre: 0 <= source < sources.
  [[nodiscard]] int loaders(int source) const {
    std::lock_guard lock(mutex_);
    return static_cast<int>(loaders_[static_cast<std::size_t>(source)].size());
  }
  /// Samples read from `source` so far, over all its loaders (including those retired by scaling).
  [[nodiscard]] std::int64_t reads(int source) const {
    std::lock_guard lock(mutex_);
    std::int64_t r = retired_reads_.empty() ? 0 : retired_reads_[static_cast<std::size_t>(source)];
    for (const auto& l : loaders_[static_cast<std::size_t>(source)]) r += l->reader().reads();
    return r;
  }
  /// Measured mean preprocessing (read + decode) time per sample of `source`, in nanoseconds.
  [[nodiscard]] double cost_ns(int source) const {
    std::lock_guard lock(mutex_);
    return cost_ns_[static_cast<std::size_t>(source)];
  }
  /// Sets k_s explicitly (what the autoscaler does). Pre: k >= 1. The stream is unchanged.
  void set_loaders(int source, int k) {
    if (k < 1) throw_error<invalid_argument>("data_loader::set_loaders: k = {}; expected >= 1", k);
    const auto s = static_cast<std::size_t>(source);
    std::vector<std::shared_ptr<source_loader>> fresh;
    {
      std::lock_guard lock(mutex_);
      if (static_cast<int>(loaders_[s].size()) == k) return;
    }
    for (int j = loaders(source); j < k; ++j) fresh.push_back(open_loader(s));
    std::lock_guard lock(mutex_);
    if (retired_reads_.empty()) retired_reads_.assign(cfg_.sources.size(), 0);
    while (static_cast<int>(loaders_[s].size()) > k) {
      retired_reads_[s] += loaders_[s].back()->reader().reads();
      loaders_[s].pop_back();  // in-flight tasks keep their loader alive through their shared_ptr
    }
    for (auto& l : fresh) loaders_[s].push_back(std::move(l));
  }

  /// What this data plane holds, per component: every source loader's access state, the prefetched
  /// samples (those whose read has finished: samples being filled belong to the workers), the planner
  /// state.
  [[nodiscard]] memory_report memory() const {
    memory_report r;
    std::lock_guard lock(mutex_);
    for (std::size_t s = 0; s < loaders_.size(); ++s)
      for (std::size_t j = 0; j < loaders_[s].size(); ++j)
        r.add("source_loader", hetmesh::format("{}#{}", cfg_.sources[s].name, j),
              loaders_[s][j]->state_bytes(), loaders_[s][j]->reader().mapped_data_bytes());
    // Samples of a step still being read belong to the workers (they fill them without the lock): only
    // the bytes of finished tasks, which each worker adds under the lock, are counted.
    std::int64_t pre = 0;
    for (const auto& sl : inflight_) pre += sl->read_bytes;
    for (const auto& smp : spare_) pre += smp.heap_bytes();
    r.add("prefetch", "steps", pre);
    r.add("planner", "state",
          static_cast<std::int64_t>(sizeof(planner_state) +
                                    consumed_.cursors.capacity() * sizeof(source_cursor)));
    return r;
  }

 private:
  struct slot {
    batch_plan plan;
    planner_state next_state;
    std::vector<sample> samples;
    std::int64_t remaining = 0;
    std::int64_t read_bytes = 0;  // heap bytes of the samples of finished tasks (under the lock)
    std::exception_ptr plan_error, read_error;
  };
  // A run of samples of one step read through one loader.
  struct task {
    std::shared_ptr<slot> sl;
    std::shared_ptr<source_loader> loader;
    std::vector<std::size_t> items;  // indices into the step's plan
    std::vector<sample_ref> refs;    // refs[k] = plan.samples[items[k]].ref
  };
  // The planner's view of the sources: sizes, and (index, meta) through the loader that owns the position.
  // Holds a snapshot of the loaders taken once per planned step, so a lookup takes no lock of ours and
  // touches no reference count (a step plans hundreds to thousands of samples).
  struct meta_view {
    const std::vector<std::int64_t>* sizes;
    std::vector<std::vector<std::shared_ptr<source_loader>>> loaders;
    std::int64_t source_size(int s) const { return (*sizes)[static_cast<std::size_t>(s)]; }
    std::pair<std::int64_t, seq::sample_meta> lookup(int s, std::int64_t e, std::int64_t p) const {
      const auto& ls = loaders[static_cast<std::size_t>(s)];
      source_loader& l = *ls[static_cast<std::size_t>(p) % ls.size()];
      const auto idx = l.index_at(e, p);
      return {idx, l.meta(idx)};
    }
    // The batch lookup: a run's indices under one lock of one loader (the k_s loaders of a source hold
    // the same permutations), then its metadata in one call to the reader.
    void lookup_run(int s, std::int64_t e, std::int64_t p, std::span<std::int64_t> index,
                    std::span<seq::sample_meta> meta) const {
      const auto& ls = loaders[static_cast<std::size_t>(s)];
      source_loader& l = *ls[static_cast<std::size_t>(p) % ls.size()];
      l.index_run(e, p, index);
      l.meta_run(index, meta);
    }
  };

  std::shared_ptr<source_loader> open_loader(std::size_t s) {
    return std::make_shared<source_loader>(cfg_.sources[s], static_cast<int>(s), cfg_.seed, decode_);
  }
  void fill() {
    for (;;) {
      {
        std::lock_guard lock(mutex_);
        if (static_cast<int>(inflight_.size()) > opts_.prefetch_steps) return;
        if (!inflight_.empty() && inflight_.back()->plan_error) return;
      }
      auto sl = std::make_shared<slot>();
      try {
        meta_view view{&sizes_, {}};
        {
          std::lock_guard lock(mutex_);
          view.loaders = loaders_;
        }
        auto planned = plan_step(cfg_, plan_state_, view, split_);
        sl->plan = std::move(planned.plan);
        sl->next_state = planned.next;
      } catch (...) {
        sl->plan_error = std::current_exception();
      }
      std::lock_guard lock(mutex_);
      inflight_.push_back(sl);
      if (sl->plan_error) return;
      plan_state_ = sl->next_state;
      sl->samples.resize(sl->plan.samples.size());
      sl->remaining = 0;
      for (const auto& p : sl->plan.samples) sl->remaining += served_[static_cast<std::size_t>(p.dp_rank)];
      for (auto& t : make_tasks_locked(sl)) tasks_.push_back(std::move(t));
      if (opts_.workers > 0) cv_.notify_all();
    }
  }

  // Groups a step's samples by (source, loader = position mod k_s), in runs of at most chunk_samples.
  std::vector<task> make_tasks_locked(const std::shared_ptr<slot>& sl) const {
    std::vector<task> out;
    std::vector<std::size_t> first(loaders_.size() + 1, 0);  // (source, loader) -> first + loader
    for (std::size_t s = 0; s < loaders_.size(); ++s) first[s + 1] = first[s] + loaders_[s].size();
    constexpr std::size_t none = ~std::size_t{0};
    std::vector<std::size_t> open(first.back(), none);  // -> index in out of the run being filled
    const auto chunk = static_cast<std::size_t>(std::max(1, opts_.chunk_samples));
    for (std::size_t i = 0; i < sl->plan.samples.size(); ++i) {
      if (served_[static_cast<std::size_t>(sl->plan.samples[i].dp_rank)] == 0) continue;
      const auto& ref = sl->plan.samples[i].ref;
      const auto s = static_cast<std::size_t>(ref.source);
      const std::size_t k = loaders_[s].size();  // k_s: a mask when a power of two (no division per sample)
      const auto pos = static_cast<std::size_t>(ref.position);
      const std::size_t j = (k & (k - 1)) == 0 ? pos & (k - 1) : pos % k;
      auto& at = open[first[s] + j];
      if (at == none || out[at].items.size() >= chunk) {
        out.push_back({sl, loaders_[s][j], {}, {}});
        out.back().items.reserve(chunk);
        out.back().refs.reserve(chunk);
        at = out.size() - 1;
      }
      out[at].items.push_back(i);
      out[at].refs.push_back(ref);
    }
    return out;
  }
  // Takes the next task and hands it recycled buffers: the ones consumed last, still warm in the cache,
  // and under the lock the caller holds anyway, so reads take no lock for them.
  task pop_task_locked() {
    task t = std::move(tasks_.front());
    tasks_.pop_front();
    ++active_;
    for (std::size_t i : t.items) {
      if (spare_.empty()) break;
      t.sl->samples[i] = std::move(spare_.back());
      spare_.pop_back();
    }
    return t;
  }

  // Runs a task from pop_task_locked; takes the lock once, at the end.
  void run_task(const task& t) {
    const auto begin = std::chrono::steady_clock::now();
    t.loader->load_run(
        std::span<const sample_ref>(t.refs),
        [&](std::size_t k) -> sample& { return t.sl->samples[t.items[k]]; },
        [&](std::size_t) {
          std::lock_guard lock(mutex_);
          if (!t.sl->read_error) t.sl->read_error = std::current_exception();
        });
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - begin).count() /
        static_cast<double>(t.items.size());
    const auto s = static_cast<std::size_t>(t.sl->plan.samples[t.items.front()].ref.source);
    std::int64_t bytes = 0;  // this task's samples are still this worker's alone
    for (const std::size_t i : t.items) bytes += t.sl->samples[i].heap_bytes();
    std::lock_guard lock(mutex_);
    t.sl->read_bytes += bytes;
    cost_ns_[s] =
        cost_ns_[s] == 0 ? ns : 0.8 * cost_ns_[s] + 0.2 * ns;  // moving average of read + decode per sample
    t.sl->remaining -= static_cast<std::int64_t>(t.items.size());
    // Wake waiters only when it matters (next() waits for its step; restore waits for idle readers): a
    // wake-up per task would cost the consumer a context switch each.
    if (--active_ == 0 || t.sl->remaining == 0) done_cv_.notify_all();
  }

  void work() {
    for (;;) {
      task t;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        if (stop_) return;
        t = pop_task_locked();
      }
      run_task(t);
    }
  }

  void maybe_autoscale() {
    const auto& a = opts_.autoscale;
    if (!a.enabled || a.interval_steps <= 0 || consumed_.step % a.interval_steps != 0) return;
    std::vector<double> costs;
    {
      std::lock_guard lock(mutex_);
      costs = cost_ns_;
    }
    const int budget = a.loader_budget > 0 ? a.loader_budget : 2 * static_cast<int>(cfg_.sources.size());
    const auto k = autoscale_loaders(costs, weights_at(cfg_, consumed_.step + a.lookahead_steps), budget,
                                     a.max_per_source);
    for (std::size_t s = 0; s < k.size(); ++s) set_loaders(static_cast<int>(s), k[s]);
  }

  mixture_config cfg_;
  loader_options opts_;
  wds_decoder decode_;
  Split split_{};
  mutable std::mutex mutex_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::vector<std::shared_ptr<source_loader>>> loaders_{};
  std::vector<std::int64_t> sizes_{}, retired_reads_{};
  std::vector<double> cost_ns_{};
  std::vector<char> served_{};  // per data-parallel rank: loaded here
  std::deque<std::shared_ptr<slot>> inflight_;
  std::deque<task> tasks_;
  std::vector<sample> spare_;
  planner_state plan_state_{}, consumed_{};
  int active_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_{};
};

/// The data loader that balances with LPT (balance::lpt_partition), the default.
using data_loader = basic_data_loader<balance::lpt_partition>;

}  // namespace hetmesh::data
