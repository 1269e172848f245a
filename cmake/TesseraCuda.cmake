# Turns TESSERA_CUDA_ARCHS into explicit -gencode flags. We do not use CMAKE_CUDA_ARCHITECTURES:
# the arch-specific "a" targets (sm_90a) must be spelled as -gencode=arch=compute_90a,code=sm_90a,
# and we want SASS only (plus PTX of the newest target for forward compatibility).
set(CMAKE_CUDA_ARCHITECTURES OFF)
set(TESSERA_CUDA_GENCODE "")
set(_tessera_last_arch "")
foreach(_arch IN LISTS TESSERA_CUDA_ARCHS)
  if(NOT _arch MATCHES "^(80|86|89|90|90a|100a|120)$")
    message(FATAL_ERROR "TESSERA_CUDA_ARCHS entry '${_arch}' is not one of 80, 86, 89, 90, 90a, 100a, 120")
  endif()
  list(APPEND TESSERA_CUDA_GENCODE "-gencode=arch=compute_${_arch},code=sm_${_arch}")
  set(_tessera_last_arch ${_arch})
endforeach()
if(NOT _tessera_last_arch MATCHES "a$")
  list(APPEND TESSERA_CUDA_GENCODE "-gencode=arch=compute_${_tessera_last_arch},code=compute_${_tessera_last_arch}")
endif()
message(STATUS "Tessera kernels for: ${TESSERA_CUDA_ARCHS}")

# Applies Tessera's CUDA compile options to a target.
function(tessera_cuda_target target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${TESSERA_CUDA_GENCODE} --expt-relaxed-constexpr -lineinfo -Xptxas=-warn-spills>)
endfunction()
