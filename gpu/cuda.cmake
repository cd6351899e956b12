# Decides whether the CUDA parts (gpu/, tiers/hbm/, tests/gpu/) are built;
# included by the top-level CMakeLists.txt, which declares KVTIER_CUDA:
#   AUTO  build them when a CUDA compiler and toolkit are found (default)
#   ON    build them; configure fails when CUDA is not found
#   OFF   never build them
# Sets KVTIER_HAVE_CUDA (ON/OFF) for other folders to test; targets that
# link kvtier_gpu also get the compile definition KVTIER_HAVE_CUDA=1.
# The CUDA runtime code is compiled by the C++ compiler against
# CUDA::cudart; nvcc only compiles kernels (the bench's busy-loop kernel).
string(TOUPPER "${KVTIER_CUDA}" kvtier_cuda_mode)
if(NOT kvtier_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "KVTIER_CUDA must be AUTO, ON or OFF, not '${KVTIER_CUDA}'")
endif()

set(KVTIER_HAVE_CUDA OFF)
if(NOT kvtier_cuda_mode STREQUAL "OFF")
  # nvcc is often not on PATH (/usr/local/cuda/bin): point the standard
  # search at the usual place unless the user chose a compiler.
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(KVTIER_NVCC nvcc HINTS ENV CUDA_PATH ENV CUDA_HOME /usr/local/cuda PATH_SUFFIXES bin)
    if(KVTIER_NVCC)
      set(ENV{CUDACXX} "${KVTIER_NVCC}")
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  set(kvtier_cuda_why "")
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Turing (T4), Ampere (A100, and sm_86/89 run sm_80 code), Hopper
      # (H100/H200) natively; PTX of 90 for anything newer.
      set(CMAKE_CUDA_ARCHITECTURES "75-real;80-real;90")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND)
      set(KVTIER_HAVE_CUDA ON)
    else()
      set(kvtier_cuda_why "the CUDA toolkit (find_package(CUDAToolkit)) was not found")
    endif()
  else()
    set(kvtier_cuda_why "no working CUDA compiler (nvcc) was found; set CUDACXX or CMAKE_CUDA_COMPILER")
  endif()
  if(NOT KVTIER_HAVE_CUDA AND kvtier_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "KVTIER_CUDA=ON but ${kvtier_cuda_why}")
  endif()
endif()

if(KVTIER_HAVE_CUDA)
  message(STATUS "kvtier: CUDA parts enabled (toolkit ${CUDAToolkit_VERSION}, nvcc ${CMAKE_CUDA_COMPILER}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES})")
elseif(kvtier_cuda_mode STREQUAL "OFF")
  message(STATUS "kvtier: CUDA parts disabled (KVTIER_CUDA=OFF)")
else()
  message(STATUS "kvtier: CUDA parts disabled: ${kvtier_cuda_why}")
endif()
