# Keeps the GPU choice of a pip build directory from one `pip install` to the next.
#
# scikit-build-core deletes CMakeCache.txt whenever the isolated build environment is new,
# which is every `pip install`, so the cache alone cannot carry QG_GPU from the README's
# `pip install .` to its `pip install -e ".[test]"`: the second would fall back to the
# default and could rebuild a CUDA checkout CPU-only (or the reverse). pyproject.toml
# passes QG_GPU, QG_CUDA_ARCHS and QG_HIP_ARCHS only when the environment variable is
# set; one that is not set takes the value the previous configure of this build
# directory used, from the file below (it lives beside the cache, which is cleared,
# and survives). Plain CMake builds keep their cache and do not need it.
#
# Included before the QG_* cache defaults of CMakeLists.txt; qg_remember_gpu_choice()
# writes the file once they are final.
set(_qg_gpu_choice_file "${CMAKE_BINARY_DIR}/quantgemm-gpu-choice.cmake")
set(_qg_gpu_choice_vars QG_GPU QG_CUDA_ARCHS QG_HIP_ARCHS)

if(DEFINED SKBUILD AND EXISTS "${_qg_gpu_choice_file}")
  include("${_qg_gpu_choice_file}")   # defines _qg_prev_<var> for each var
  foreach(_v IN LISTS _qg_gpu_choice_vars)
    if(NOT DEFINED CACHE{${_v}} AND DEFINED _qg_prev_${_v})
      set(${_v} "${_qg_prev_${_v}}" CACHE STRING "kept from the previous build in ${CMAKE_BINARY_DIR}")
      message(STATUS "quantgemm: ${_v}=${_qg_prev_${_v}} kept from the previous build "
                     "(set the environment variable ${_v} to change it)")
    endif()
  endforeach()
endif()

function(qg_remember_gpu_choice)
  if(NOT DEFINED SKBUILD)
    return()
  endif()
  set(_text "# Written by cmake/QGRememberGPU.cmake: the GPU choice of the last configure.\n")
  foreach(_v IN LISTS _qg_gpu_choice_vars)
    string(APPEND _text "set(_qg_prev_${_v} [==[${${_v}}]==])\n")
  endforeach()
  file(WRITE "${_qg_gpu_choice_file}" "${_text}")
endfunction()
