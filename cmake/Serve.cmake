# npumoe serve (tools/cli/serve.c): built when NM_SERVE is ON, or AUTO and
# pkg-config finds both libmicrohttpd (HTTP) and jansson (JSON).
set(NM_SERVE AUTO CACHE STRING "Build npumoe serve (libmicrohttpd, jansson): AUTO, ON or OFF")
set_property(CACHE NM_SERVE PROPERTY STRINGS AUTO ON OFF)

# Sets NM_HAVE_SERVE; with it, the imported targets PkgConfig::NM_MHD and
# PkgConfig::NM_JANSSON.
function(nm_find_serve)
  set(NM_HAVE_SERVE OFF PARENT_SCOPE)
  if(NM_SERVE STREQUAL "OFF")
    message(STATUS "npumoe serve: off (NM_SERVE=OFF)")
    return()
  endif()
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(NM_MHD QUIET IMPORTED_TARGET GLOBAL libmicrohttpd)
    pkg_check_modules(NM_JANSSON QUIET IMPORTED_TARGET GLOBAL jansson)
  endif()
  if(NOT NM_MHD_FOUND OR NOT NM_JANSSON_FOUND)
    if(NM_SERVE STREQUAL "ON")
      message(FATAL_ERROR "NM_SERVE=ON needs pkg-config, libmicrohttpd and jansson "
                          "(Debian: pkg-config libmicrohttpd-dev libjansson-dev)")
    endif()
    message(STATUS "npumoe serve: not built (libmicrohttpd or jansson not found)")
    return()
  endif()
  message(STATUS "npumoe serve: built (libmicrohttpd ${NM_MHD_VERSION}, jansson ${NM_JANSSON_VERSION})")
  set(NM_HAVE_SERVE ON PARENT_SCOPE)
endfunction()
