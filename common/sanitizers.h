// Which sanitizer this translation unit is built with, for g++ and clang
// alike: g++ defines __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__, clang
// answers __has_feature. KVTIER_ASAN / KVTIER_TSAN are 1 under
// AddressSanitizer / ThreadSanitizer, else 0.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define KVTIER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVTIER_ASAN 1
#endif
#endif
#ifndef KVTIER_ASAN
#define KVTIER_ASAN 0
#endif

#if defined(__SANITIZE_THREAD__)
#define KVTIER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVTIER_TSAN 1
#endif
#endif
#ifndef KVTIER_TSAN
#define KVTIER_TSAN 0
#endif
