// Status: the error value every kvtier call returns. Standard library only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace kvtier {

// Stable codes: their numeric values are part of the wire protocol and the C
// ABI (KVTIER_* in kvtier_c.h). Append only.
enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,      // the caller sent something malformed
  kNotFound = 2,             // key, lease or reservation not present
  kAlreadyExists = 3,        // the block is already cached (or being written)
  kNoSpace = 4,              // the tier cannot make room (everything pinned)
  kBusy = 5,                 // try again later (resource temporarily held)
  kIoError = 6,              // a system call failed
  kCorruption = 7,           // stored bytes failed their checksum
  kProtocolError = 8,        // framing or message-level violation
  kVersionMismatch = 9,      // client and daemon speak different protocols
  kUnavailable = 10,         // not connected / the daemon went away
  kPermissionDenied = 11,    // e.g. a lease owned by another connection
  kFailedPrecondition = 12,  // call out of order (Commit without Reserve)
  kUnimplemented = 13,       // unknown request type
  kInternal = 14,            // a bug: reported, never silently ignored
  kCancelled = 15,           // shutting down
  kTimedOut = 16,
};

// Returns the stable lower-case name of `code` ("not_found"...).
std::string_view StatusCodeName(StatusCode code);

// A code plus a human-readable message. Cheap to copy when ok.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "not_found: key 0x... not cached" or "ok".
  std::string ToString() const;

  // Marks an error as deliberately dropped; say why at the call site.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) { return a.code_ == b.code_ && a.message_ == b.message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status NoSpace(std::string m) { return {StatusCode::kNoSpace, std::move(m)}; }
inline Status Busy(std::string m) { return {StatusCode::kBusy, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
inline Status ProtocolError(std::string m) { return {StatusCode::kProtocolError, std::move(m)}; }
inline Status VersionMismatch(std::string m) { return {StatusCode::kVersionMismatch, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status TimedOut(std::string m) { return {StatusCode::kTimedOut, std::move(m)}; }

}  // namespace kvtier
