# tessera_add_plugin(<target> SOURCES <files>... [LIBS <libs>...] [NO_INSTALL]
#                    [OUTPUT_DIRECTORY <dir>] [INSTALL_DESTINATION <dir>])
#
# One runtime-loaded plugin library: a MODULE with a single exported entry point (TESSERA_PLUGIN),
# every other symbol hidden, linked to the Tessera core. Used in the tree and, installed beside
# TesseraConfig.cmake, by out-of-tree plugins after find_package(Tessera).
#
# The loader picks up files named libtessera_*.so, so a target whose name does not start with
# "tessera_" gets that prefix on its file (target priority_fair -> libtessera_priority_fair.so).
# OUTPUT_DIRECTORY defaults to the tree's plugin folder in the Tessera build and to the current
# binary folder elsewhere; the library installs into INSTALL_DESTINATION (default
# <libdir>/tessera/plugins, where an installed tessera finds it when both share a prefix).
function(tessera_add_plugin target)
  cmake_parse_arguments(ARG "NO_INSTALL" "OUTPUT_DIRECTORY;INSTALL_DESTINATION" "SOURCES;LIBS" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "tessera_add_plugin(${target}): no SOURCES given")
  endif()
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "tessera_add_plugin(${target}): unknown arguments ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE Tessera::core ${ARG_LIBS})
  set(output_name ${target})
  if(NOT target MATCHES "^tessera_")
    set(output_name tessera_${target})
  endif()
  if(NOT ARG_OUTPUT_DIRECTORY)
    if(DEFINED TESSERA_PLUGIN_OUTPUT_DIR)
      set(ARG_OUTPUT_DIRECTORY ${TESSERA_PLUGIN_OUTPUT_DIR})
    else()
      set(ARG_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
    endif()
  endif()
  if(NOT ARG_INSTALL_DESTINATION)
    if(DEFINED TESSERA_PLUGIN_SUBDIR)
      set(ARG_INSTALL_DESTINATION ${TESSERA_PLUGIN_SUBDIR})
    else()
      include(GNUInstallDirs)
      set(ARG_INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/tessera/plugins)
    endif()
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    SUFFIX ".so"
    OUTPUT_NAME ${output_name}
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIRECTORY})
  if(NOT ARG_NO_INSTALL)
    install(TARGETS ${target} LIBRARY DESTINATION ${ARG_INSTALL_DESTINATION})
  endif()
  set_property(GLOBAL APPEND PROPERTY TESSERA_PLUGIN_TARGETS ${target})
endfunction()
