#include "tiers/nvme/nvme_index.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace kvtier {
namespace {

// Key space: 'b' + key (hi, lo big-endian, so iteration follows key order),
// 'r' + region (big-endian). Values are fixed little-endian records with a
// leading format byte.
constexpr char kEntryTag = 'b';
constexpr char kRegionTag = 'r';
constexpr uint8_t kValueFormat = 1;
constexpr size_t kEntryValueBytes = 1 + 16 + 8 + 4 + 8 + 8 + 4 + 8 + 4 + 8 + 8;
constexpr size_t kRegionValueBytes = 1 + 8 + 4 + 8;

void PutBig64(std::string& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t GetBig64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

class Writer {
 public:
  Writer& U8(uint8_t v) { return Raw(&v, 1); }
  Writer& U32(uint32_t v) { return Raw(&v, 4); }  // x86-64 and arm64 Linux are little-endian
  Writer& U64(uint64_t v) { return Raw(&v, 8); }
  std::string Take() { return std::move(out_); }

 private:
  Writer& Raw(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const rocksdb::Slice& s) : p_(s.data()), end_(s.data() + s.size()) {}
  uint8_t U8() { return Raw<uint8_t>(); }
  uint32_t U32() { return Raw<uint32_t>(); }
  uint64_t U64() { return Raw<uint64_t>(); }
  bool ok() const { return p_ <= end_; }

 private:
  template <typename T>
  T Raw() {
    T v{};
    if (p_ + sizeof(T) <= end_) std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  const char* p_;
  const char* end_;
};

std::string EntryKey(const BlockKey& key) {
  std::string k(1, kEntryTag);
  PutBig64(k, key.hi);
  PutBig64(k, key.lo);
  return k;
}

std::string RegionKey(uint32_t region) {
  std::string k(1, kRegionTag);
  for (int i = 3; i >= 0; --i) k.push_back(static_cast<char>(region >> (8 * i)));
  return k;
}

std::string EncodeEntry(const IndexEntry& e) {
  return Writer()
      .U8(kValueFormat)
      .U64(e.ns.hi)
      .U64(e.ns.lo)
      .U64(e.payload_checksum)
      .U32(e.region)
      .U64(e.offset)
      .U64(e.payload_bytes)
      .U32(e.layer_count)
      .U64(e.region_generation)
      .U32(e.flags)
      .U64(e.hits)
      .U64(static_cast<uint64_t>(e.last_use_us))
      .Take();
}

Result<IndexEntry> DecodeEntry(const rocksdb::Slice& value) {
  if (value.size() != kEntryValueBytes || static_cast<uint8_t>(value[0]) != kValueFormat) {
    return Corruption("index entry of " + std::to_string(value.size()) + " bytes does not decode");
  }
  Reader r(value);
  r.U8();
  IndexEntry e;
  e.ns.hi = r.U64();
  e.ns.lo = r.U64();
  e.payload_checksum = r.U64();
  e.region = r.U32();
  e.offset = r.U64();
  e.payload_bytes = r.U64();
  e.layer_count = r.U32();
  e.region_generation = r.U64();
  e.flags = r.U32();
  e.hits = r.U64();
  e.last_use_us = static_cast<int64_t>(r.U64());
  return e;
}

std::string EncodeRegion(const RegionState& s) {
  return Writer().U8(kValueFormat).U64(s.generation).U32(static_cast<uint32_t>(s.status)).U64(s.seal_sequence).Take();
}

Result<RegionState> DecodeRegion(uint32_t region, const rocksdb::Slice& value) {
  if (value.size() != kRegionValueBytes || static_cast<uint8_t>(value[0]) != kValueFormat) {
    return Corruption("region record of " + std::to_string(value.size()) + " bytes does not decode");
  }
  Reader r(value);
  r.U8();
  RegionState s;
  s.region = region;
  s.generation = r.U64();
  const uint32_t status = r.U32();
  if (status > static_cast<uint32_t>(RegionStatus::kSealed)) {
    return Corruption("region " + std::to_string(region) + " has unknown status " + std::to_string(status));
  }
  s.status = static_cast<RegionStatus>(status);
  s.seal_sequence = r.U64();
  return s;
}

// `a` and `b` describe the same record (the same place in the same life of
// its region).
bool SameRecord(const IndexEntry& a, const IndexEntry& b) {
  return a.region == b.region && a.region_generation == b.region_generation && a.offset == b.offset;
}

// `entry` describes a record of an earlier generation of `region`'s region.
bool InRegionBefore(const IndexEntry& entry, const RegionState& region) {
  return entry.region == region.region && entry.region_generation < region.generation;
}

Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  if (s.IsNotFound()) return NotFound(what + ": not found");
  if (s.IsCorruption()) return Corruption(what + ": " + s.ToString());
  return IoError(what + ": " + s.ToString());
}

}  // namespace

NvmeIndex::NvmeIndex(std::unique_ptr<rocksdb::DB> db, bool sync_writes)
    : db_(std::move(db)), sync_writes_(sync_writes) {}

NvmeIndex::~NvmeIndex() = default;

namespace {

// Creates the index directory 0700, or makes an existing one 0700, never
// through a symbolic link. RocksDB creates its files with modes of its own
// (0644 under a 022 umask; Env::SetAllowNonOwnerAccess(false) returns OK in
// Debian 12's 7.8.3 and changes nothing), and the umask is process-wide:
// the directory is what keeps others from every file in it, present and
// later.
Status MakePrivateDirectory(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return IoError("cannot create the nvme index directory " + path + ": " + std::strerror(errno));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP || errno == ENOTDIR) {  // O_DIRECTORY|O_NOFOLLOW on a symbolic link: either
      struct stat link {};
      if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
        return InvalidArgument("the nvme index " + path + " is a symbolic link; name the directory itself");
      }
      return InvalidArgument("the nvme index " + path + " is not a directory");
    }
    return IoError("cannot open the nvme index directory " + path + ": " + std::strerror(errno));
  }
  struct stat st {};
  Status made = Status::Ok();
  if (::fstat(fd, &st) != 0) {
    made = IoError("cannot stat the nvme index directory " + path + ": " + std::strerror(errno));
  } else if ((st.st_mode & 07777) != 0700 && ::fchmod(fd, 0700) != 0) {
    made = IoError("cannot make the nvme index directory " + path + " private (mode 0700): " + std::strerror(errno));
  }
  ::close(fd);
  return made;
}

}  // namespace

Result<std::unique_ptr<NvmeIndex>> NvmeIndex::Open(const std::string& path, bool sync_writes) {
  if (Status s = MakePrivateDirectory(path); !s.ok()) return s;
  rocksdb::Options options;
  options.create_if_missing = true;
  options.paranoid_checks = true;
  options.max_open_files = 256;
  options.keep_log_file_num = 4;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, path, &raw);
  if (!s.ok()) return FromRocks(s, "cannot open the nvme index at " + path);
  return std::unique_ptr<NvmeIndex>(new NvmeIndex(std::unique_ptr<rocksdb::DB>(raw), sync_writes));
}

namespace {
rocksdb::WriteOptions Writes(bool sync) {
  rocksdb::WriteOptions w;
  w.sync = sync;
  return w;
}
}  // namespace

Status NvmeIndex::Put(const BlockKey& key, const IndexEntry& entry) {
  BeforeMutation();
  return FromRocks(db_->Put(Writes(sync_writes_), EntryKey(key), EncodeEntry(entry)), "nvme index put");
}

Status NvmeIndex::Delete(const BlockKey& key) {
  BeforeMutation();
  return FromRocks(db_->Delete(Writes(sync_writes_), EntryKey(key)), "nvme index delete");
}

Status NvmeIndex::DeleteIfCurrent(const BlockKey& key, const IndexEntry& entry) {
  BeforeMutation();
  const std::string entry_key = EntryKey(key);
  std::string value;
  rocksdb::Status read = db_->Get(rocksdb::ReadOptions(), entry_key, &value);
  if (read.IsNotFound()) return Status::Ok();
  if (!read.ok()) return FromRocks(read, "nvme index conditional delete (read)");
  // A value that does not decode cannot be shown to be another record's:
  // it goes, as asked (kept, it would stop every start-up's scan).
  auto stored = DecodeEntry(value);
  if (stored.ok() && !SameRecord(*stored, entry)) return Status::Ok();
  return FromRocks(db_->Delete(Writes(sync_writes_), entry_key), "nvme index conditional delete");
}

Result<IndexEntry> NvmeIndex::Get(const BlockKey& key) const {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), EntryKey(key), &value);
  if (!s.ok()) return FromRocks(s, "nvme index get");
  return DecodeEntry(value);
}

Status NvmeIndex::PutRegion(const RegionState& region) {
  BeforeMutation();
  return FromRocks(db_->Put(Writes(sync_writes_), RegionKey(region.region), EncodeRegion(region)),
                   "nvme index region put");
}

Status NvmeIndex::ResetRegion(const RegionState& region, std::span<const BlockKey> keys) {
  BeforeMutation();
  // The index is keyed by block, not by record: by the time the reset is
  // applied, a key may already name a newer record of the block elsewhere
  // (a reinsertion's copy, indexed after the reclaim was decided). Only
  // the entries still in an earlier generation of this region go.
  std::vector<std::string> entry_keys;
  entry_keys.reserve(keys.size());
  for (const auto& k : keys) entry_keys.push_back(EntryKey(k));
  std::vector<rocksdb::Slice> slices(entry_keys.begin(), entry_keys.end());
  std::vector<rocksdb::PinnableSlice> values(slices.size());
  std::vector<rocksdb::Status> statuses(slices.size());
  if (!slices.empty()) {
    db_->MultiGet(rocksdb::ReadOptions(), db_->DefaultColumnFamily(), slices.size(), slices.data(), values.data(),
                  statuses.data());
  }
  rocksdb::WriteBatch batch;
  for (size_t i = 0; i < slices.size(); ++i) {
    if (statuses[i].IsNotFound()) continue;
    if (!statuses[i].ok()) return FromRocks(statuses[i], "nvme index region reset (read)");
    auto stored = DecodeEntry(values[i]);
    // A value that does not decode cannot be shown to be another record's:
    // it goes, as asked (kept, it would stop every start-up's scan).
    if (stored.ok() && !InRegionBefore(*stored, region)) continue;
    batch.Delete(slices[i]);
  }
  batch.Put(RegionKey(region.region), EncodeRegion(region));
  return FromRocks(db_->Write(Writes(sync_writes_), &batch), "nvme index region reset");
}

Status NvmeIndex::ForEachEntry(const std::function<void(const BlockKey&, const IndexEntry&)>& visit) const {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  const std::string prefix(1, kEntryTag);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    const rocksdb::Slice k = it->key();
    if (k.size() != 17) return Corruption("nvme index key of " + std::to_string(k.size()) + " bytes");
    auto entry = DecodeEntry(it->value());
    if (!entry.ok()) return entry.status();
    visit(BlockKey{GetBig64(k.data() + 1), GetBig64(k.data() + 9)}, *entry);
  }
  return FromRocks(it->status(), "nvme index scan");
}

Status NvmeIndex::ForEachRegion(const std::function<void(const RegionState&)>& visit) const {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  const std::string prefix(1, kRegionTag);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    const rocksdb::Slice k = it->key();
    if (k.size() != 5) return Corruption("nvme region key of " + std::to_string(k.size()) + " bytes");
    uint32_t region = 0;
    for (int i = 1; i < 5; ++i) region = (region << 8) | static_cast<uint8_t>(k[i]);
    auto state = DecodeRegion(region, it->value());
    if (!state.ok()) return state.status();
    visit(*state);
  }
  return FromRocks(it->status(), "nvme region scan");
}

}  // namespace kvtier
