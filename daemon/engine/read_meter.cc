#include "daemon/engine/read_meter.h"

namespace kvtier {

void ReadMeter::Started(uint64_t now_us) {
  MutexLock lock(mu_);
  if (reads_in_flight_++ == 0) {
    busy_since_us_ = now_us;
    busy_bytes_ = 0;
  }
}

void ReadMeter::Ended(uint64_t bytes, uint64_t now_us) {
  MutexLock lock(mu_);
  busy_bytes_ += bytes;
  const bool idle = --reads_in_flight_ == 0;
  if (!idle && busy_bytes_ < kSampleBytes) return;
  if (busy_bytes_ != 0) estimate_.Observe(busy_bytes_, now_us - busy_since_us_);
  busy_since_us_ = now_us;
  busy_bytes_ = 0;
}

BandwidthEstimate ReadMeter::estimate() const {
  MutexLock lock(mu_);
  return estimate_;
}

}  // namespace kvtier
