// Mover (daemon/engine/mover.h): jobs run in order on the mover's threads, the
// queue is bounded in jobs and in buffered bytes (an empty queue still
// admits one oversized job), and a job's room returns once it has run.
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/engine/mover.h"

namespace kvtier {
namespace {

struct Collect : CounterVisitor {
  void Visit(std::string_view name, int64_t value) override { values[std::string(name)] = value; }
  std::map<std::string, int64_t> values;
};

std::map<std::string, int64_t> CountersOf(const Mover& mover) {
  Collect c;
  mover.VisitCounters(c);
  return c.values;
}

TEST(MoverTest, RunsJobsInOrderOffTheCallingThread) {
  Mover mover("m", 1, 1 << 20, 16);
  std::mutex mu;
  std::vector<int> order;
  std::promise<std::thread::id> ran_on;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(mover.TrySubmit([&, i] {
      std::lock_guard lock(mu);
      order.push_back(i);
      if (i == 4) ran_on.set_value(std::this_thread::get_id());
    }));
  }
  EXPECT_NE(ran_on.get_future().get(), std::this_thread::get_id());
  std::lock_guard lock(mu);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(MoverTest, RefusesPastItsJobAndByteBoundsAndFreesRoomAfterAJob) {
  Mover mover("m", 1, /*max_bytes=*/100, /*max_jobs=*/3);
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  // An empty queue admits a job larger than the byte bound.
  ASSERT_TRUE(mover.TryReserve(150));
  mover.Submit(150, [open] { open.wait(); });
  EXPECT_FALSE(mover.TryReserve(1)) << "150 of 100 bytes are buffered";
  EXPECT_TRUE(mover.TrySubmit([] {})) << "a job without bytes still fits";
  EXPECT_TRUE(mover.TrySubmit([] {}));
  EXPECT_FALSE(mover.TrySubmit([] {})) << "three jobs are queued, the bound";
  auto c = CountersOf(mover);
  EXPECT_EQ(c["m.jobs_queued"], 3);
  EXPECT_EQ(c["m.bytes_queued"], 150);
  EXPECT_EQ(c["m.refused"], 2);
  // TryReserve and Unreserve: room taken and handed back.
  gate.set_value();
  std::promise<void> done;
  while (!mover.TrySubmit([&done] { done.set_value(); })) std::this_thread::yield();
  done.get_future().wait();
  ASSERT_TRUE(mover.TryReserve(100));
  mover.Unreserve(100);
  c = CountersOf(mover);
  EXPECT_EQ(c["m.bytes_queued"], 0);
}

TEST(MoverTest, DestructorRunsEveryQueuedJob) {
  int ran = 0;
  std::mutex mu;
  {
    Mover mover("m", 2, 0, 64);
    for (int i = 0; i < 50; ++i) {
      ASSERT_TRUE(mover.TrySubmit([&] {
        std::lock_guard lock(mu);
        ++ran;
      }));
    }
  }
  EXPECT_EQ(ran, 50);
}

}  // namespace
}  // namespace kvtier
