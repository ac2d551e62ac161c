# tessera_add_plugin(<target> SOURCES ...): one runtime-loaded library with a single exported
# entry point; every other symbol is hidden.
function(tessera_add_plugin target)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE tessera::core ${ARG_LIBS})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY ${TESSERA_PLUGIN_OUTPUT_DIR})
  install(TARGETS ${target} LIBRARY DESTINATION ${TESSERA_PLUGIN_SUBDIR})
  set_property(GLOBAL APPEND PROPERTY TESSERA_PLUGIN_TARGETS ${target})
endfunction()
