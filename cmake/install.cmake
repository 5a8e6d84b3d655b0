# Install rules (included from the top-level CMakeLists.txt after the library and CLI targets exist).
#   include/k3.h, lib/libk3.so (+ SONAME links), lib/libk3.a, bin/k3,
#   lib/cmake/k3kernels/ (k3kernels::k3 and k3kernels::k3_static), lib/pkgconfig/k3kernels.pc
# `cmake --install BUILD --prefix P` relocates everything: the CMake files locate themselves, and the pkg-config
# file derives its prefix from where it lies (${pcfiledir}).
include(CMakePackageConfigHelpers)

set(K3_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/k3kernels)
set(K3_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

install(TARGETS k3 k3_static EXPORT k3kernelsTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS k3_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${CMAKE_SOURCE_DIR}/include/k3.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

install(EXPORT k3kernelsTargets NAMESPACE k3kernels:: DESTINATION ${K3_CMAKE_DIR})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/k3kernelsConfig.cmake.in
  ${CMAKE_BINARY_DIR}/k3kernelsConfig.cmake INSTALL_DESTINATION ${K3_CMAKE_DIR})
# Before 1.0 a minor version may break the ABI: only the same MAJOR.MINOR satisfies a request.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/k3kernelsConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/k3kernelsConfig.cmake ${CMAKE_BINARY_DIR}/k3kernelsConfigVersion.cmake
  DESTINATION ${K3_CMAKE_DIR})

# ---- pkg-config ----
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(K3_PC_PREFIX "${CMAKE_INSTALL_PREFIX}") # absolute folders: not relocatable
else()
  file(RELATIVE_PATH K3_PC_UP "/${K3_PC_DIR}" "/")
  string(REGEX REPLACE "/$" "" K3_PC_UP "${K3_PC_UP}")
  set(K3_PC_PREFIX "\${pcfiledir}/${K3_PC_UP}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(K3_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  set(K3_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(K3_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(K3_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
# The same split as the CMake targets: the CUDA runtime is public, libm and cuBLASLt private (static linking).
set(K3_PC_CFLAGS "-I\${includedir}")
set(K3_PC_LIBS "-L\${libdir} -lk3")
set(K3_PC_LIBS_PRIVATE "-lm")
foreach(l ${CMAKE_DL_LIBS})
  string(APPEND K3_PC_LIBS_PRIVATE " -l${l}")
endforeach()
if(K3_HAVE_CUDA)
  foreach(d ${CUDAToolkit_INCLUDE_DIRS})
    string(APPEND K3_PC_CFLAGS " -I${d}")
  endforeach()
  string(APPEND K3_PC_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcudart")
  string(APPEND K3_PC_LIBS_PRIVATE " -lcublasLt")
  if(K3_CXX_RUNTIME)
    string(APPEND K3_PC_LIBS_PRIVATE " -l${K3_CXX_RUNTIME}") # see K3_PRIVATE_LIBS in CMakeLists.txt
  endif()
endif()
if(K3_SANITIZE)
  # a sanitized library needs the sanitizer runtimes in the program that loads it
  string(REPLACE ";" " " K3_PC_SAN "${K3_SAN_FLAGS}")
  string(APPEND K3_PC_LIBS " ${K3_PC_SAN}")
endif()
configure_file(${CMAKE_SOURCE_DIR}/cmake/k3kernels.pc.in ${CMAKE_BINARY_DIR}/k3kernels.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/k3kernels.pc DESTINATION ${K3_PC_DIR})
