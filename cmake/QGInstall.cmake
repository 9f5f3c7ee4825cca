# `cmake --install BUILD --prefix P` for engines that link libquantgemm without Python:
#
#   P/include/quantgemm.h                         the whole public C ABI
#   P/lib/libquantgemm.so -> .so.0 -> .so.0.1.0   soname libquantgemm.so.<major>
#   P/lib/pkgconfig/quantgemm.pc                  cc ex.c $(pkg-config --cflags --libs quantgemm)
#   P/lib/cmake/quantgemm/quantgemmConfig.cmake   find_package(quantgemm) -> quantgemm::quantgemm
#
# (lib/ is CMAKE_INSTALL_LIBDIR: lib64 on distributions that use it.) The soname carries
# the major version only: quantgemm.h's rules (enums only grow, argument structs start
# with their size and only grow) keep minor versions binary compatible, so an engine
# linked against 0.1 loads a later 0.x. Every file is relocatable: the .pc file and the
# CMake package find the prefix from where they lie, not from CMAKE_INSTALL_PREFIX, so
# `--prefix` at install time is all it takes.
#
# pip builds (scikit-build-core sets SKBUILD) install only pyquant/libquantgemm.so, the
# file pyquant loads with ctypes: see CMakeLists.txt.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# quantgemm.h's QG_VERSION_* must be the project version the soname and the .pc file say.
file(STRINGS "${CMAKE_CURRENT_SOURCE_DIR}/include/quantgemm.h" _qg_version_lines
     REGEX "^#define QG_VERSION_(MAJOR|MINOR|PATCH) ")
set(_qg_header_version "")
foreach(_part MAJOR MINOR PATCH)
  string(REGEX MATCH "QG_VERSION_${_part} ([0-9]+)" _m "${_qg_version_lines}")
  list(APPEND _qg_header_version "${CMAKE_MATCH_1}")
endforeach()
list(JOIN _qg_header_version "." _qg_header_version)
if(NOT _qg_header_version STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "include/quantgemm.h says version ${_qg_header_version}, "
                      "CMakeLists.txt project() says ${PROJECT_VERSION}: keep them equal")
endif()

set_target_properties(quantgemm PROPERTIES
  VERSION "${PROJECT_VERSION}"
  SOVERSION "${PROJECT_VERSION_MAJOR}")
target_include_directories(quantgemm INTERFACE
  "$<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>"
  "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
# The same name inside a parent project (add_subdirectory) as after find_package.
add_library(quantgemm::quantgemm ALIAS quantgemm)

install(TARGETS quantgemm EXPORT quantgemmTargets
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}"
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")
install(FILES "${CMAKE_CURRENT_SOURCE_DIR}/include/quantgemm.h"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")

set(_qg_cmake_dir "${CMAKE_INSTALL_LIBDIR}/cmake/quantgemm")
install(EXPORT quantgemmTargets NAMESPACE quantgemm:: DESTINATION "${_qg_cmake_dir}")
configure_package_config_file("${CMAKE_CURRENT_SOURCE_DIR}/cmake/quantgemmConfig.cmake.in"
  "${CMAKE_CURRENT_BINARY_DIR}/quantgemmConfig.cmake" INSTALL_DESTINATION "${_qg_cmake_dir}")
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/quantgemmConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMajorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/quantgemmConfig.cmake"
              "${CMAKE_CURRENT_BINARY_DIR}/quantgemmConfigVersion.cmake"
        DESTINATION "${_qg_cmake_dir}")

# pkg-config: prefix relative to the .pc file's own folder (${pcfiledir}), so the file is
# right wherever --prefix puts it; an absolute CMAKE_INSTALL_LIBDIR / INCLUDEDIR is kept.
set(_qg_pc_dir "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
file(RELATIVE_PATH QG_PC_PREFIX "/qg-prefix/${_qg_pc_dir}" "/qg-prefix")
string(REGEX REPLACE "/$" "" QG_PC_PREFIX "\${pcfiledir}/${QG_PC_PREFIX}")
foreach(_d LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_d}}")
    set(QG_PC_${_d} "${CMAKE_INSTALL_${_d}}")
  else()
    set(QG_PC_${_d} "\${prefix}/${CMAKE_INSTALL_${_d}}")
  endif()
endforeach()
configure_file("${CMAKE_CURRENT_SOURCE_DIR}/cmake/quantgemm.pc.in"
               "${CMAKE_CURRENT_BINARY_DIR}/quantgemm.pc" @ONLY)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/quantgemm.pc" DESTINATION "${_qg_pc_dir}")
