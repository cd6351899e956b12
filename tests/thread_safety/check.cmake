# Proves that the thread-safety check bites: compiles good.cc, which must
# pass, and each snippet that misuses a lock, which must fail with clang's
# thread-safety diagnostic, all with -Wthread-safety -Wthread-safety-beta
# -Werror -fsyntax-only (the flags of the `thread-safety` preset; the beta
# analysis is what checks ACQUIRED_BEFORE)
# against common/mutex.h and common/thread_annotations.h. Run as:
#   cmake -DSOURCE_DIR=... -DCLANGXX=/usr/bin/clang++ -P this
# Prints "SKIPPED:" (the test's skip pattern) when clang++ is absent.
if(NOT EXISTS "${CLANGXX}")
  message("SKIPPED: ${CLANGXX} not found; the thread-safety check needs clang")
  return()
endif()
set(dir "${SOURCE_DIR}/tests/thread_safety")
set(flags -std=c++20 -fsyntax-only -Wthread-safety -Wthread-safety-beta -Werror "-I${SOURCE_DIR}")

execute_process(COMMAND "${CLANGXX}" ${flags} "${dir}/good.cc"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "good.cc should compile cleanly but did not:\n${out}")
endif()

# Each misuse, and the diagnostic it must produce.
set(cases
  "unguarded_read.cc|reading variable 'count_' requires holding mutex 'mu_'"
  "missing_requires.cc|calling function 'AddLocked' requires holding mutex 'mu_' exclusively"
  "write_under_reader_lock.cc|writing variable 'value_' requires holding shared_mutex 'mu_' exclusively"
  "inverted_lock_order.cc|mutex 'outer_' must be acquired before 'inner_'")
foreach(case ${cases})
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 file)
  list(GET parts 1 expected)
  execute_process(COMMAND "${CLANGXX}" ${flags} "${dir}/${file}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "${file} misuses a lock but compiled: the thread-safety check does not bite")
  endif()
  string(FIND "${out}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${file} failed, but not with \"${expected}\":\n${out}")
  endif()
  message(STATUS "${file}: refused as expected")
endforeach()
