#include "daemon/engine/read_meter.h"

#include "common/check.h"

namespace kvtier {

void ReadMeter::Started(uint64_t bytes, uint64_t now_us) {
  MutexLock lock(mu_);
  bytes_in_flight_ += bytes;
  if (reads_in_flight_++ == 0) {
    busy_since_us_ = now_us;
    busy_bytes_ = 0;
  }
}

void ReadMeter::Ended(uint64_t started_bytes, uint64_t read_bytes, uint64_t now_us) {
  MutexLock lock(mu_);
  KVTIER_CHECK(reads_in_flight_ > 0 && started_bytes <= bytes_in_flight_, "a read ended that was not started");
  bytes_in_flight_ -= started_bytes;
  busy_bytes_ += read_bytes;
  const bool idle = --reads_in_flight_ == 0;
  if (!idle && busy_bytes_ < kSampleBytes) return;
  if (busy_bytes_ != 0 && now_us > busy_since_us_) {  // Observe ignores a period of no time
    estimate_.Observe(busy_bytes_, now_us - busy_since_us_);
    last_sample_us_ = now_us;
    sampled_ = true;
  }
  busy_since_us_ = now_us;
  busy_bytes_ = 0;
}

BandwidthEstimate ReadMeter::estimate() const {
  MutexLock lock(mu_);
  return estimate_;
}

uint64_t ReadMeter::last_sample_us() const {
  MutexLock lock(mu_);
  return last_sample_us_;
}

bool ReadMeter::sampled() const {
  MutexLock lock(mu_);
  return sampled_;
}

ReadMeter::InFlight ReadMeter::in_flight() const {
  MutexLock lock(mu_);
  return InFlight{reads_in_flight_, bytes_in_flight_};
}

}  // namespace kvtier
