# The C and C++ sources follow .clang-format: clang-format --dry-run -Werror
# over every source file below SOURCE_DIR's product and test folders (or over
# FILES, a list, when given: the check's own control). Run as:
#   cmake -DSOURCE_DIR=... -DCLANG_FORMAT=/usr/bin/clang-format-14 -P this
# The layout is clang-format 14's (Debian 12's); another version may wrap a
# few lines differently, so the test names the binary it ran.
# Prints "SKIPPED:" (the test's skip pattern) when clang-format is absent;
# scripts/install-deps.sh installs it.
if(NOT EXISTS "${CLANG_FORMAT}")
  message("SKIPPED: ${CLANG_FORMAT} not found; scripts/install-deps.sh installs clang-format")
  return()
endif()
if(NOT FILES)
  set(folders client_lib common daemon gpu include policy proto python support tests tiers tools)
  set(FILES "")
  foreach(folder ${folders})
    foreach(ext c cc h cu cuh)
      file(GLOB_RECURSE found "${SOURCE_DIR}/${folder}/*.${ext}")
      list(APPEND FILES ${found})
    endforeach()
  endforeach()
  # The control's deliberately misformatted file.
  list(FILTER FILES EXCLUDE REGEX "/tests/data/format/")
endif()
list(LENGTH FILES n)
if(n EQUAL 0)
  message(FATAL_ERROR "no source files found below ${SOURCE_DIR}")
endif()
# In chunks, so that no command line grows past the system's limit.
set(failed "")
while(FILES)
  list(SUBLIST FILES 0 100 chunk)
  list(LENGTH FILES left)
  if(left GREATER 100)
    list(SUBLIST FILES 100 -1 FILES)
  else()
    set(FILES "")
  endif()
  execute_process(COMMAND "${CLANG_FORMAT}" --dry-run -Werror ${chunk}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(APPEND failed "${out}")
  endif()
endwhile()
if(failed)
  message(FATAL_ERROR "not laid out as .clang-format says (fix with: ${CLANG_FORMAT} -i FILE):\n${failed}")
endif()
message("${n} files follow .clang-format (${CLANG_FORMAT})")
