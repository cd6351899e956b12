# `cmake --install` of BUILD_DIR into a temporary DESTDIR, then: every file a
# Debian package would ship is where GNUInstallDirs says, and the installed
# kvtier runs its installed siblings (from libexec/kvtier, not the build
# tree). Run as: cmake -DBUILD_DIR=... -DPREFIX=... -DBINDIR=... (see
# tests/CMakeLists.txt) -P check_install.cmake
cmake_minimum_required(VERSION 3.25)
string(RANDOM LENGTH 8 suffix)
if(DEFINED ENV{TMPDIR} AND NOT "$ENV{TMPDIR}" STREQUAL "")
  set(tmp "$ENV{TMPDIR}")
else()
  set(tmp "/tmp")
endif()
set(destdir "${tmp}/kvtier-install-${suffix}")
file(REMOVE_RECURSE "${destdir}")

function(fail why)
  file(REMOVE_RECURSE "${destdir}")
  message(FATAL_ERROR "${why}")
endfunction()

execute_process(COMMAND ${CMAKE_COMMAND} -E env DESTDIR=${destdir} ${CMAKE_COMMAND} --install ${BUILD_DIR}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  fail("cmake --install failed (${rc}):\n${out}\n${err}")
endif()

set(root "${destdir}${PREFIX}")
set(expected
  "${root}/${BINDIR}/kvtierd"
  "${root}/${BINDIR}/kvtier"
  "${root}/${LIBEXECDIR}/kvtier/kvtier-bench"
  "${root}/${LIBEXECDIR}/kvtier/kvtier-replay"
  "${root}/${LIBEXECDIR}/kvtier/kvtier-stress"
  "${root}/${LIBEXECDIR}/kvtier/kvtier-supervise"
  "${root}/${LIBEXECDIR}/kvtier/kvtier-trace"
  "${root}/${LIBDIR}/libkvtier_client.so"
  "${root}/${LIBDIR}/libkvtier_proto.so"
  "${root}/lib/systemd/system/kvtierd.service"
  "${root}/${DOCDIR}/examples/kvtierd.toml"
  "${destdir}${SYSCONFDIR}/kvtier/kvtierd.toml")
file(GLOB headers RELATIVE ${SOURCE_DIR}/include "${SOURCE_DIR}/include/kvtier/*.h")
foreach(header ${headers})
  list(APPEND expected "${root}/${INCLUDEDIR}/${header}")
endforeach()
foreach(path ${expected})
  if(NOT EXISTS "${path}")
    fail("cmake --install did not install ${path}")
  endif()
endforeach()
foreach(program "${root}/${BINDIR}/kvtierd" "${root}/${BINDIR}/kvtier")
  execute_process(COMMAND test -x "${program}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    fail("${program} is not executable")
  endif()
endforeach()

# The installed kvtier, with the installed library (as on a machine with the
# package), runs each installed sibling; nothing of the build tree is used.
foreach(command bench replay stress trace)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${root}/${LIBDIR}"
                          "${root}/${BINDIR}/kvtier" ${command} --help
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "kvtier ${command}")
    fail("installed `kvtier ${command} --help` failed (${rc}):\n${out}\n${err}")
  endif()
endforeach()
# And an installed tool starts the installed kvtierd by default (stress
# --spawn without --kvtierd: libexec/kvtier/../../bin/kvtierd).
execute_process(COMMAND ${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${root}/${LIBDIR}" "PATH=/usr/bin:/bin"
                        "${root}/${BINDIR}/kvtier" stress --spawn --seconds 1 --clients 1
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "${root}/${BINDIR}/kvtierd")
  fail("installed `kvtier stress --spawn` did not run the installed kvtierd (${rc}):\n${out}\n${err}")
endif()
file(REMOVE_RECURSE "${destdir}")
message(STATUS "install tree complete under ${PREFIX}; the installed kvtier runs its siblings")
