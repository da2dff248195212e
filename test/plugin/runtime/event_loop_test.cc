// The owner loops' event loop: its descriptors, timers, wake-ups and
// signals (through a real signalfd).
#include "plugin/runtime/event_loop.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "plugin/runtime/signals.h"
#include "test/support/descriptor_table_full.h"
#include "test/support/fake_clock.h"
#include "test/support/sanitized.h"

using efa::plugin::EventLoop;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

namespace {

// The bound of a wait that should end at once: a loop that misses its
// wake-up returns only then, and the test fails instead of hanging.
constexpr auto kBound = 10s;

// Blocks the owner loops' signals in this thread while it lives, as
// BlockOwnerLoopSignals() does for the daemon; then takes back those still
// pending (a failed test's) and restores the mask.
class SignalsBlocked {
 public:
  SignalsBlocked() {
    const sigset_t set = efa::plugin::OwnerLoopSignals();
    pthread_sigmask(SIG_BLOCK, &set, &saved_);
  }
  ~SignalsBlocked() {
    const sigset_t set = efa::plugin::OwnerLoopSignals();
    const timespec zero{};
    while (::sigtimedwait(&set, nullptr, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }
  SignalsBlocked(const SignalsBlocked&) = delete;
  SignalsBlocked& operator=(const SignalsBlocked&) = delete;

 private:
  sigset_t saved_;
};

// A pipe, closed with the object.
struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() { REQUIRE(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0); }
  ~Pipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
};

}  // namespace

TEST_CASE("The event loop runs its handlers, then the due timers in the order added",
          "[event-loop]") {
  efa::testing::FakeClock clock;  // moves only when the test says
  EventLoop loop({.clock = &clock, .take_signals = false, .on_hangup = nullptr});
  REQUIRE(loop.Open().ok());
  std::vector<std::string> ran;
  Pipe readable, quiet;
  loop.Watch(quiet.fds[0], [&ran] { ran.push_back("quiet pipe"); });
  loop.Watch(readable.fds[0], [&] {
    char c;
    REQUIRE(::read(readable.fds[0], &c, 1) == 1);
    ran.push_back("readable pipe");
  });
  const EventLoop::TimePoint later = clock.Now() + 1ms;
  loop.AddTimer([later] { return later; }, [&ran] { ran.push_back("later"); });
  loop.AddTimer([] { return EventLoop::TimePoint::max(); }, [&ran] { ran.push_back("never"); });
  loop.AddTimer([] { return EventLoop::TimePoint::min(); }, [&ran] { ran.push_back("at once"); });
  REQUIRE(::write(readable.fds[1], "x", 1) == 1);

  REQUIRE(loop.RunOnce());  // "at once" is due: no wait
  CHECK(ran == std::vector<std::string>{"readable pipe", "at once"});
  ran.clear();
  clock.Advance(1ms);
  REQUIRE(loop.RunOnce());
  CHECK(ran == std::vector<std::string>{"later", "at once"});
  CHECK_FALSE(loop.stopped());
}

TEST_CASE("The event loop wakes for its earliest timer, wake_by, Wake() and Stop()",
          "[event-loop][concurrency]") {
  EventLoop loop(EventLoop::Options{});
  REQUIRE(loop.Open().ok());
  const auto start = SteadyClock::now();
  SECTION("a timer") {
    const auto due = start + 20ms;
    bool ran = false;
    loop.AddTimer([&] { return ran ? EventLoop::TimePoint::max() : due; }, [&ran] { ran = true; });
    REQUIRE(loop.RunOnce(start + kBound));
    CHECK(ran);
    CHECK(SteadyClock::now() >= due);
    CHECK(SteadyClock::now() - start < kBound / 2);
  }
  SECTION("wake_by") {
    loop.AddTimer([] { return EventLoop::TimePoint::max(); }, [] { FAIL("never due"); });
    REQUIRE(loop.RunOnce(start + 20ms));
    CHECK(SteadyClock::now() >= start + 20ms);
    CHECK(SteadyClock::now() - start < kBound / 2);
  }
  SECTION("Wake() from another thread") {
    std::thread waker([&loop] { loop.Wake(); });
    REQUIRE(loop.RunOnce(start + kBound));
    waker.join();
    CHECK(SteadyClock::now() - start < kBound / 2);
    CHECK_FALSE(loop.stopped());
  }
  SECTION("Stop() from another thread") {
    std::thread stopper([&loop] { loop.Stop(); });
    REQUIRE(loop.RunOnce(start + kBound));
    stopper.join();
    CHECK(SteadyClock::now() - start < kBound / 2);
    CHECK(loop.stopped());
  }
}

TEST_CASE("The event loop takes SIGHUP to its hook and stops on SIGTERM, through a signalfd",
          "[event-loop]") {
  SignalsBlocked blocked;
  int hangups = 0;
  EventLoop loop({.clock = &efa::plugin::Clock::Steady(),
                  .take_signals = true,
                  .on_hangup = [&hangups] { ++hangups; }});
  REQUIRE(loop.Open().ok());
  // To this thread, which has them blocked: the signalfd reads them here.
  REQUIRE(::pthread_kill(::pthread_self(), SIGHUP) == 0);
  REQUIRE(loop.RunOnce(SteadyClock::now() + kBound));
  CHECK(hangups == 1);
  CHECK_FALSE(loop.stopped());
  REQUIRE(::pthread_kill(::pthread_self(), SIGTERM) == 0);
  REQUIRE(loop.RunOnce(SteadyClock::now() + kBound));
  CHECK(loop.stopped());
  CHECK(hangups == 1);
}

TEST_CASE("An event loop without its eventfd does not open, naming the cause", "[event-loop]") {
  if (efa::testing::kSanitized) {
    WARN("not run under a sanitizer: its runtime needs descriptors while none are left");
    return;
  }
  efa::testing::DescriptorTableFull full;
  EventLoop loop(EventLoop::Options{});
  full.Release();
  CHECK(loop.Open().message() == "cannot create an eventfd: Too many open files");
}
