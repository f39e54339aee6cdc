# npumoe serve (tools/cli/serve.c): built when NM_SERVE is ON, or AUTO and
# pkg-config finds libmicrohttpd (HTTP); jansson (JSON) is found for the
# library already (CMakeLists.txt).
set(NM_SERVE AUTO CACHE STRING "Build npumoe serve (libmicrohttpd, jansson): AUTO, ON or OFF")
set_property(CACHE NM_SERVE PROPERTY STRINGS AUTO ON OFF)

# Sets NM_HAVE_SERVE; with it, the imported target PkgConfig::NM_MHD.
function(nm_find_serve)
  set(NM_HAVE_SERVE OFF PARENT_SCOPE)
  if(NM_SERVE STREQUAL "OFF")
    message(STATUS "npumoe serve: off (NM_SERVE=OFF)")
    return()
  endif()
  pkg_check_modules(NM_MHD QUIET IMPORTED_TARGET GLOBAL libmicrohttpd)
  if(NOT NM_MHD_FOUND)
    if(NM_SERVE STREQUAL "ON")
      message(FATAL_ERROR "NM_SERVE=ON needs libmicrohttpd (Debian: libmicrohttpd-dev)")
    endif()
    message(STATUS "npumoe serve: not built (libmicrohttpd not found)")
    return()
  endif()
  message(STATUS "npumoe serve: built (libmicrohttpd ${NM_MHD_VERSION}, jansson ${NM_JANSSON_VERSION})")
  set(NM_HAVE_SERVE ON PARENT_SCOPE)
endfunction()
