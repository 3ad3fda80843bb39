# Decides whether the CUDA backend is built. TIERFLOW_WITH_CUDA:
#   AUTO  build it when a CUDA compiler and toolkit are found (the normal case on CI machines)
#   ON    require it: configuration fails without a CUDA toolkit
#   OFF   never build it
# Sets TIERFLOW_CUDA_ENABLED and, when enabled, the CUDA language and CUDA::cudart_static.
string(TOUPPER "${TIERFLOW_WITH_CUDA}" _tierflow_cuda_mode)
if(NOT _tierflow_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "TIERFLOW_WITH_CUDA must be AUTO, ON or OFF, not '${TIERFLOW_WITH_CUDA}'")
endif()

set(TIERFLOW_CUDA_ENABLED OFF)
if(NOT _tierflow_cuda_mode STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # sm_90 (Hopper: H100/H200) code plus compute_90 PTX for newer GPUs to JIT.
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
  endif()
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    set(TIERFLOW_CUDA_ENABLED ON)
    message(STATUS "tierflow: CUDA backend ON (CUDA ${CUDAToolkit_VERSION}, "
                   "architectures ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(_tierflow_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "TIERFLOW_WITH_CUDA=ON but no CUDA compiler/toolkit was found; "
                        "set CMAKE_CUDA_COMPILER or use TIERFLOW_WITH_CUDA=AUTO/OFF")
  else()
    message(STATUS "tierflow: CUDA backend OFF (no CUDA toolkit found)")
  endif()
else()
  message(STATUS "tierflow: CUDA backend OFF (TIERFLOW_WITH_CUDA=OFF)")
endif()
