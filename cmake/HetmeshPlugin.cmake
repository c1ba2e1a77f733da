# hetmesh_add_device_plugin(<name> SOURCES <files...> [LINK <targets...>])
#
# Builds libhetmesh-device-<name>.so: a MODULE that exports only hm_device_plugin_v1 (version
# script), binds its own symbols first (-Bsymbolic) and refuses undefined symbols at link time.
# Works in the hetmesh tree and, through find_package(hetmesh), for out-of-tree plugins.
set(_HETMESH_PLUGIN_MAP "${CMAKE_CURRENT_LIST_DIR}/plugin.map")

function(hetmesh_add_device_plugin name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LINK" ${ARGN})
  set(target hetmesh-device-${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE hetmesh::sdk ${ARG_LINK})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    CXX_VISIBILITY_PRESET hidden
    C_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LINK_DEPENDS "${_HETMESH_PLUGIN_MAP}")
  target_link_options(${target} PRIVATE
    "LINKER:--version-script=${_HETMESH_PLUGIN_MAP}" "LINKER:-Bsymbolic" "LINKER:--no-undefined")
  if(NOT TARGET hetmesh::sdk)
    message(FATAL_ERROR "hetmesh_add_device_plugin: hetmesh::sdk is not defined")
  endif()
endfunction()
