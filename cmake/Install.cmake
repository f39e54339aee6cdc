# `cmake --install`: the library (static, or shared with BUILD_SHARED_LIBS),
# include/npumoe.h, the npumoe command, a pkg-config file and a CMake
# package (find_package(npumoe) gives the target npumoe::npumoe). Both
# package files locate the prefix from where they are installed, so
# `cmake --install --prefix DIR` may put them anywhere.
include(CMakePackageConfigHelpers)

install(TARGETS npumoe_lib EXPORT npumoeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS npumoe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES include/npumoe.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(nm_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/npumoe)
install(EXPORT npumoeTargets NAMESPACE npumoe:: DESTINATION ${nm_cmake_dir})
configure_package_config_file(cmake/npumoeConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/npumoeConfig.cmake INSTALL_DESTINATION ${nm_cmake_dir})
# 0.x: a new minor version may change the API
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/npumoeConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/npumoeConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/npumoeConfigVersion.cmake
        DESTINATION ${nm_cmake_dir})

# pkg-config: the prefix relative to the .pc file's own folder; what a
# static libnpumoe needs besides itself goes to Libs.private (--static)
set(nm_pc_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH nm_pc_to_prefix /prefix/${nm_pc_dir} /prefix)
string(REGEX REPLACE "/$" "" nm_pc_to_prefix "${nm_pc_to_prefix}")
set(nm_pc_private "-lm -lpthread")
if(NM_HAVE_VULKAN AND CMAKE_DL_LIBS)
  string(APPEND nm_pc_private " -l${CMAKE_DL_LIBS}")
endif()
configure_file(cmake/npumoe.pc.in ${CMAKE_CURRENT_BINARY_DIR}/npumoe.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/npumoe.pc DESTINATION ${nm_pc_dir})

# a shared build's installed command finds the library beside it
if(BUILD_SHARED_LIBS)
  set_target_properties(npumoe PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
endif()

# A shared library exports the public API alone: a linker version script
# made from the functions include/npumoe.h declares (every nm_ name it writes
# followed by a parenthesis), everything else local. The command and the
# examples are built on that header alone, so they link against it; the
# tests, which call internal functions, use the static library.
if(BUILD_SHARED_LIBS)
  file(READ ${CMAKE_CURRENT_SOURCE_DIR}/include/npumoe.h nm_header)
  string(REGEX MATCHALL "nm_[a-z0-9_]+\\(" nm_public "${nm_header}")
  list(TRANSFORM nm_public REPLACE "\\($" "")
  list(REMOVE_DUPLICATES nm_public)
  list(JOIN nm_public ";\n    " nm_public)
  set(nm_map ${CMAKE_CURRENT_BINARY_DIR}/npumoe.map)
  file(WRITE ${nm_map} "NPUMOE_${PROJECT_VERSION_MAJOR} {\n  global:\n    ${nm_public};\n  local: *;\n};\n")
  target_link_options(npumoe_lib PRIVATE "LINKER:--version-script=${nm_map}")
  set_property(TARGET npumoe_lib APPEND PROPERTY LINK_DEPENDS ${nm_map})
endif()
