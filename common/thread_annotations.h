// Macros for clang's thread-safety analysis (-Wthread-safety): they state
// which mutex guards a member (GUARDED_BY), which lock a function expects
// held (REQUIRES) or not held (EXCLUDES), and which lock is taken before
// which (ACQUIRED_BEFORE / ACQUIRED_AFTER), so the compiler checks what the
// comments used to say. On compilers without the attributes (g++, which
// builds the release) every macro is empty and changes nothing.
//
// The std lock types carry no attributes in libstdc++, so annotated code
// locks through the wrappers of common/mutex.h. The `thread-safety` preset
// builds everything with clang and -Wthread-safety -Wthread-safety-beta
// -Werror: the beta analysis is the one that checks ACQUIRED_BEFORE.
#pragma once

#if defined(__clang__) && !defined(SWIG)
#define KVTIER_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KVTIER_THREAD_ANNOTATION(x)
#endif

// A class whose objects are locks (a mutex type).
#define CAPABILITY(x) KVTIER_THREAD_ANNOTATION(capability(x))
// A RAII class that holds a lock from its constructor to its destructor.
#define SCOPED_CAPABILITY KVTIER_THREAD_ANNOTATION(scoped_lockable)
// The member may be read or written only with the lock held.
#define GUARDED_BY(x) KVTIER_THREAD_ANNOTATION(guarded_by(x))
// What the pointer member points at may be touched only with the lock held.
#define PT_GUARDED_BY(x) KVTIER_THREAD_ANNOTATION(pt_guarded_by(x))
// The lock is taken before (after) the named ones when both are held.
#define ACQUIRED_BEFORE(...) KVTIER_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) KVTIER_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
// The caller must hold the locks exclusively (shared) when calling.
#define REQUIRES(...) KVTIER_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) KVTIER_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
// The function takes (gives back) the locks, exclusively or shared.
#define ACQUIRE(...) KVTIER_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) KVTIER_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) KVTIER_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) KVTIER_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
// RELEASE_GENERIC: gives back a lock held either way (a scoped lock's end).
#define RELEASE_GENERIC(...) KVTIER_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
// The function takes the locks when it returns the first argument.
#define TRY_ACQUIRE(...) KVTIER_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define TRY_ACQUIRE_SHARED(...) KVTIER_THREAD_ANNOTATION(try_acquire_shared_capability(__VA_ARGS__))
// The caller must not hold the locks (the function takes them itself).
#define EXCLUDES(...) KVTIER_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// Checks at run time that the lock is held; the analysis then assumes it.
#define ASSERT_CAPABILITY(x) KVTIER_THREAD_ANNOTATION(assert_capability(x))
// The function returns a reference to the named lock.
#define RETURN_CAPABILITY(x) KVTIER_THREAD_ANNOTATION(lock_returned(x))
// Turns the analysis off for one function. Every use says why next to it.
#define NO_THREAD_SAFETY_ANALYSIS KVTIER_THREAD_ANNOTATION(no_thread_safety_analysis)
