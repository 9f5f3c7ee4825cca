# GPU toolchain detection for quantgemm.
#
# Input : QG_GPU = auto | cuda | hip | off
# Output: QG_GPU_LANG = CUDA | HIP | "" (CPU only), with the language enabled.
#
# auto  : CUDA when check_language(CUDA) finds nvcc, else HIP when CMake's HIP
#         language finds ROCm's clang, else CPU only.
# cuda / hip : the toolchain is required; a missing one is a configure error.
include(CheckLanguage)

set(QG_GPU_LANG "")
string(TOLOWER "${QG_GPU}" _qg_gpu)

if(_qg_gpu STREQUAL "auto")
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(QG_GPU_LANG CUDA)
  else()
    check_language(HIP)
    if(CMAKE_HIP_COMPILER)
      set(QG_GPU_LANG HIP)
    endif()
  endif()
elseif(_qg_gpu STREQUAL "cuda")
  set(QG_GPU_LANG CUDA)
elseif(_qg_gpu STREQUAL "hip")
  set(QG_GPU_LANG HIP)
elseif(_qg_gpu STREQUAL "off")
  set(QG_GPU_LANG "")
else()
  message(FATAL_ERROR "QG_GPU=${QG_GPU} is not one of auto, cuda, hip, off")
endif()

if(QG_GPU_LANG STREQUAL "CUDA")
  # Architectures must be known before enable_language so that CMake's compiler
  # check uses them. "90a" becomes -gencode=arch=compute_90a,code=sm_90a.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "${QG_CUDA_ARCHS}")
  endif()
  enable_language(CUDA)
  set(QG_GPU_ARCHS "${CMAKE_CUDA_ARCHITECTURES}")
elseif(QG_GPU_LANG STREQUAL "HIP")
  if(NOT DEFINED CMAKE_HIP_ARCHITECTURES)
    set(CMAKE_HIP_ARCHITECTURES "${QG_HIP_ARCHS}")
  endif()
  enable_language(HIP)
  set(QG_GPU_ARCHS "${CMAKE_HIP_ARCHITECTURES}")
endif()

unset(_qg_gpu)
