// support/fd_store.h: the stand-in for systemd's file descriptor store
// (sd_notify FDSTORE=1 over $NOTIFY_SOCKET, fds handed back at 3, 4, ...
// with LISTEN_FDS / LISTEN_FDNAMES / LISTEN_PID), and Spawn's pass_fds, env
// and listen_pid.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "support/fd_store.h"
#include "support/process.h"
#include "support/servers.h"
#include "support/temp_dir.h"

namespace kvtier::support {
namespace {

// Sends one sd_notify datagram with `fds` attached, as sd_pid_notify_with_fds
// does. Only system calls and stack buffers: usable in a forked child.
bool SendNotify(const char* socket_path, const char* text, const int* fds, size_t n_fds) {
  const int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path, sizeof(addr.sun_path) - 1);
  iovec iov{const_cast<char*>(text), std::strlen(text)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)] = {};
  msghdr msg{};
  msg.msg_name = &addr;
  msg.msg_namelen = sizeof(addr);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (n_fds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
  }
  const bool ok = ::sendmsg(s, &msg, 0) == static_cast<ssize_t>(iov.iov_len);
  ::close(s);
  return ok;
}

bool Send(const FdStore& store, const std::string& text, const std::vector<int>& fds = {}) {
  return SendNotify(store.socket_path().c_str(), text.c_str(), fds.data(), fds.size());
}

// A memfd holding `bytes` (written with pwrite: its offset stays at 0).
int MemfdWith(const char* name, const std::string& bytes) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC);
  if (fd >= 0) {
    EXPECT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  }
  return fd;
}

std::string ReadAll(int fd) {
  char buffer[256];
  const ssize_t n = ::pread(fd, buffer, sizeof(buffer), 0);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
}

// Runs `script` under /bin/sh with `options`; returns its output.
std::string RunShell(const std::string& script, const SpawnOptions& options) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return "pipe2 failed";
  const Result<pid_t> pid = Spawn({"/bin/sh", "-c", script}, out[1], options);
  ::close(out[1]);
  if (!pid.ok()) {
    ::close(out[0]);
    return pid.status().ToString();
  }
  std::string output;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(out[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(buffer, static_cast<size_t>(n));
  }
  ::close(out[0]);
  ::waitpid(*pid, nullptr, 0);
  return output;
}

// Frees fds [first, first + count) of this process for a test and puts back
// whatever was there when it ends.
class FreeFds {
 public:
  FreeFds(int first, int count) : first_(first) {
    for (int fd = first; fd < first + count; ++fd) {
      saved_.push_back(::fcntl(fd, F_DUPFD_CLOEXEC, 100));  // -1: was not open
      ::close(fd);
    }
  }
  ~FreeFds() {
    for (size_t i = 0; i < saved_.size(); ++i) {
      const int fd = first_ + static_cast<int>(i);
      ::close(fd);
      if (saved_[i] >= 0) {
        ::dup2(saved_[i], fd);
        ::close(saved_[i]);
      }
    }
  }

 private:
  int first_;
  std::vector<int> saved_;
};

// Moves `fd` to `target` (free, from FreeFds).
bool PlaceAt(int fd, int target) {
  if (fd < 0) return false;
  if (fd == target) return true;
  const bool ok = ::dup2(fd, target) == target;
  ::close(fd);
  return ok;
}

class FdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::string> dir = MakeTempDir("kvtier-fd-store-test-");
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    dir_ = *dir;
    Result<std::unique_ptr<FdStore>> store = FdStore::Open(dir_ + "/notify.sock");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
  }
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) RemoveTree(dir_);
  }

  std::string dir_;
  std::unique_ptr<FdStore> store_;
};

TEST_F(FdStoreTest, KeepsNamedFdsDropsRemovedOnesAndClosesTheRest) {
  const int a = MemfdWith("a", "bytes of a");
  const int b1 = MemfdWith("b1", "b1");
  const int b2 = MemfdWith("b2", "b2");
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK), 0);
  ASSERT_TRUE(Send(*store_, "FDSTORE=1\nFDNAME=a\nFDPOLL=0", {a}));
  ASSERT_TRUE(Send(*store_, "FDSTORE=1\nFDNAME=b", {b1, b2}));
  ASSERT_TRUE(Send(*store_, "STATUS=no store here", {pipe_fds[1]}));  // fds without FDSTORE=1: closed
  ASSERT_TRUE(Send(*store_, "FDSTORE=1\nFDNAME=again", {a}));         // the same file as a: held once
  ASSERT_TRUE(Send(*store_, "READY=1\nSTATUS=x\nMONOTONIC_USEC=1"));
  ASSERT_TRUE(Send(*store_, "WATCHDOG=1"));
  ::close(pipe_fds[1]);
  ASSERT_TRUE(store_->Drain().ok());

  EXPECT_EQ(store_->names(), (std::vector<std::string>{"a", "b", "b"}));
  EXPECT_EQ(store_->size(), 3u);
  EXPECT_EQ(store_->ready_count(), 1);
  EXPECT_EQ(store_->last_status(), "x");
  EXPECT_EQ(store_->refused(), 0u);
  ASSERT_EQ(store_->fds().size(), 3u);
  EXPECT_EQ(ReadAll(store_->fds()[0]), "bytes of a");
  EXPECT_EQ(ReadAll(store_->fds()[2]), "b2");
  // The store closed its copy of the pipe's write end: the read end sees EOF.
  char c;
  EXPECT_EQ(::read(pipe_fds[0], &c, 1), 0) << std::strerror(errno);
  ::close(pipe_fds[0]);

  ASSERT_TRUE(Send(*store_, "FDSTOREREMOVE=1\nFDNAME=b"));
  ASSERT_TRUE(Send(*store_, "FDSTOREREMOVE=1"));  // no FDNAME: nothing removed
  ASSERT_TRUE(Send(*store_, "FDSTORE=1", {b1}));  // no FDNAME: "stored"
  ASSERT_TRUE(Send(*store_, "FDSTORE=1\nFDNAME=bad:name", {b2}));
  ASSERT_TRUE(store_->Drain().ok());
  EXPECT_EQ(store_->names(), (std::vector<std::string>{"a", "stored"}));
  EXPECT_EQ(store_->refused(), 1u);
  ::close(a);
  ::close(b1);
  ::close(b2);
  store_->Clear();
  EXPECT_EQ(store_->size(), 0u);
}

TEST_F(FdStoreTest, RefusesFdsOverItsCap) {
  Result<std::unique_ptr<FdStore>> small = FdStore::Open(dir_ + "/small.sock", 2);
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  std::vector<int> fds;
  for (const char* name : {"1", "2", "3"}) fds.push_back(MemfdWith(name, name));
  ASSERT_TRUE(Send(**small, "FDSTORE=1\nFDNAME=m", fds));
  ASSERT_TRUE((*small)->Drain().ok());
  EXPECT_EQ((*small)->size(), 2u);
  EXPECT_EQ((*small)->refused(), 1u);
  for (int fd : fds) ::close(fd);
}

TEST_F(FdStoreTest, RejectsAPathTooLongForAUnixSocket) {
  const Result<std::unique_ptr<FdStore>> r = FdStore::Open(dir_ + "/" + std::string(200, 'x'));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(FdStoreTest, ASpawnedChildGetsTheFdsAtThreeOnwardWithItsOwnListenPid) {
  const int a = MemfdWith("fdstore-a", "hello from a");
  const int b = MemfdWith("fdstore-b", "b");
  ASSERT_TRUE(Send(*store_, "FDSTORE=1\nFDNAME=a", {a}));
  ASSERT_TRUE(Send(*store_, "FDSTORE=1\nFDNAME=b", {b}));
  ::close(a);
  ::close(b);
  ASSERT_TRUE(store_->Drain().ok());
  SpawnOptions options;
  options.env = {"KVTIER_FD_STORE_TEST=set"};
  store_->PrepareSpawn(&options);
  const std::string out = RunShell(
      "echo \"$LISTEN_PID $$ $LISTEN_FDS $LISTEN_FDNAMES $NOTIFY_SOCKET $KVTIER_FD_STORE_TEST\"; "
      "cat <&3; echo; cat <&4; echo; "
      // No temporary copy of a passed fd is left above them (an fd the test
      // itself inherited may sit at 5: only a copy of ours counts).
      "case $(readlink /proc/$$/fd/5 2>/dev/null) in *memfd:fdstore*) echo copy-left;; *) echo no-copy;; esac",
      options);
  std::vector<std::string> words;
  size_t start = 0;
  const std::string first_line = out.substr(0, out.find('\n'));
  for (size_t space; (space = first_line.find(' ', start)) != std::string::npos; start = space + 1) {
    words.push_back(first_line.substr(start, space - start));
  }
  words.push_back(first_line.substr(start));
  ASSERT_EQ(words.size(), 6u) << out;
  EXPECT_EQ(words[0], words[1]) << "LISTEN_PID is the shell's own pid: " << out;
  EXPECT_EQ(words[2], "2");
  EXPECT_EQ(words[3], "a:b");
  EXPECT_EQ(words[4], store_->socket_path());
  EXPECT_EQ(words[5], "set");
  EXPECT_EQ(out.substr(out.find('\n') + 1), "hello from a\nb\nno-copy\n");
}

TEST_F(FdStoreTest, PassFdsThatAlreadySitInTheTargetRangeLandWhereAsked) {
  FreeFds free_range(3, 4);
  ASSERT_TRUE(PlaceAt(MemfdWith("fdstore-x", "X"), 3));
  ASSERT_TRUE(PlaceAt(MemfdWith("fdstore-y", "Y"), 4));
  SpawnOptions options;
  options.pass_fds = {4, 3};  // swapped: 4 goes to 3, 3 to 4
  EXPECT_EQ(RunShell("cat <&3; cat <&4; readlink /proc/$$/fd/3", options), "YX/memfd:fdstore-y (deleted)\n");
  // The same fd twice (the reads above moved the shared offsets: names).
  options.pass_fds = {3, 3};
  EXPECT_EQ(RunShell("readlink /proc/$$/fd/3 /proc/$$/fd/4", options),
            "/memfd:fdstore-x (deleted)\n/memfd:fdstore-x (deleted)\n");
}

TEST_F(FdStoreTest, AFailedExecIsReportedWhenThePipeWouldLandInTheTargetRange) {
  FreeFds free_range(3, 6);
  // The pass fds sit high, so Spawn's report pipe takes 3 and 4: a target.
  const int m = MemfdWith("fdstore-m", "untouched");
  const int high1 = ::fcntl(m, F_DUPFD_CLOEXEC, 50);
  const int high2 = ::fcntl(m, F_DUPFD_CLOEXEC, 50);
  ::close(m);
  SpawnOptions options;
  options.search_path = false;
  options.pass_fds = {high1, high2};
  const Result<pid_t> pid = Spawn({"/nonexistent/kvtier-no-such-program"}, STDERR_FILENO, options);
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), StatusCode::kNotFound) << pid.status().ToString();
  EXPECT_EQ(ReadAll(high1), "untouched");
  struct stat st {};
  ASSERT_EQ(::fstat(high1, &st), 0);
  EXPECT_EQ(st.st_size, 9);
  ::close(high1);
  ::close(high2);
}

TEST_F(FdStoreTest, HeldFdsOutliveTheProcessThatSentThem) {
  const std::string path = store_->socket_path();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int fd = ::memfd_create("arena", MFD_CLOEXEC);
    const char bytes[] = "arena bytes";
    const bool ok = fd >= 0 && ::pwrite(fd, bytes, sizeof(bytes) - 1, 0) == static_cast<ssize_t>(sizeof(bytes) - 1) &&
                    SendNotify(path.c_str(), "FDSTORE=1\nFDNAME=arena\nFDPOLL=0", &fd, 1);
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_TRUE(store_->Drain().ok());
  ASSERT_EQ(store_->names(), std::vector<std::string>{"arena"});
  EXPECT_EQ(ReadAll(store_->fds()[0]), "arena bytes");
}

TEST_F(FdStoreTest, StartKvtierdUnderAStoreWaitsForReadyOnItsNotifySocket) {
  Result<StartedServer> server =
      StartKvtierd(KVTIERD_PATH, dir_, 64ull << 20, std::chrono::seconds(60), "", store_.get());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ(store_->ready_count(), 1);
  EXPECT_EQ(store_->last_status(), "serving on " + server->socket_path);
  EXPECT_EQ(server->process.Stop(), "exit status 0") << FileTail(server->log_path);
}

}  // namespace
}  // namespace kvtier::support
