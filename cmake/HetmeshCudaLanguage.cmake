# Enables nvcc for the CUDA code that is not the plugin: the demo's expert kernel
# (tools/demo/cuda) and the GPU baselines (plugins/cuda/tools). The cuda plugin itself is
# host code and needs only the headers. Skipped with HETMESH_WITH_CUDA=OFF, in the sanitizer build
# (it covers host code), and where there is no nvcc.
if(HETMESH_SANITIZE OR HETMESH_WITH_CUDA STREQUAL "OFF")
  return()
endif()
find_package(CUDAToolkit QUIET)  # finds nvcc in /usr/local/cuda, which may not be on PATH
if(NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE)
  set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
endif()
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(STATUS "nvcc not found: the demo's CUDA kernels and the GPU baselines are skipped")
  return()
endif()
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)  # Hopper (H100/H200), plus its PTX for newer GPUs
endif()
enable_language(CUDA)
