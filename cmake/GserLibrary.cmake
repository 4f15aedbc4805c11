# gser_add_libraries(<name> <object library> <export name>): the shared
# library <name>, the installed static library <name>_static, and
# <name>_testing for white-box tests.
#
# Internal functions are hidden in the shared library by visibility; in a
# static library visibility means nothing to the linker, so <name>_static is
# one relocatable object (ld -r) in which every hidden symbol is made local
# (cmake/gser-localize.sh): an application linking libgser.a sees only the
# public gser_* API, and cannot collide with, or bind to, gser's internals.
# The core's internal names carry the private prefix gser__, but a prefix
# does not make this step unneeded: without it the archive also gives the
# application's link the device layer's devl_* names, the C++-mangled host
# stubs nvcc makes for each __global__ kernel (_Z..._kernel...), and the
# plugins' gux_* and arrow_* names; a program defining devl_pincache_get
# then fails to link against the plain archive and links against this one.
# <name>_testing, the same objects archived without the step, keeps them
# global for the white-box tests that call them.
function(gser_add_libraries name objlib export_name)
  add_library(${name} SHARED $<TARGET_OBJECTS:${objlib}>)
  set_target_properties(${name} PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${GSER_SOVERSION}
                                           EXPORT_NAME ${export_name})

  set(obj ${CMAKE_CURRENT_BINARY_DIR}/${name}_static.o)
  add_custom_command(OUTPUT ${obj}
    COMMAND sh ${PROJECT_SOURCE_DIR}/cmake/gser-localize.sh ${CMAKE_LINKER} ${CMAKE_OBJCOPY} ${obj}
            $<TARGET_OBJECTS:${objlib}>
    # The target too, not only its files: Makefiles have no rule for
    # another target's objects, so without it a parallel build from an
    # empty folder may reach this command before they exist.
    DEPENDS ${objlib} $<TARGET_OBJECTS:${objlib}>
    COMMAND_EXPAND_LISTS VERBATIM
    COMMENT "gser: ${name}_static: one object, internal symbols local")
  add_library(${name}_static STATIC ${obj})
  add_dependencies(${name}_static ${objlib})
  set_target_properties(${name}_static PROPERTIES OUTPUT_NAME ${name} EXPORT_NAME ${export_name}_static
                                                  LINKER_LANGUAGE C)

  add_library(${name}_testing STATIC $<TARGET_OBJECTS:${objlib}>)

  foreach(t ${name} ${name}_static ${name}_testing)
    target_include_directories(${t} PUBLIC
      $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  endforeach()
  add_library(gser::${export_name} ALIAS ${name})
  add_library(gser::${export_name}_static ALIAS ${name}_static)
endfunction()

# gser_add_plugin_libraries(<name> <object library> <export name>):
# gser_add_libraries for a plugin, each of whose libraries links the core's
# of the same kind. Installed, the shared one finds libgser beside it (a
# program that uses only the plugin's calls may not list libgser itself once
# linked --as-needed).
function(gser_add_plugin_libraries name objlib export_name)
  gser_add_libraries(${name} ${objlib} ${export_name})
  set_target_properties(${name} PROPERTIES INSTALL_RPATH "$ORIGIN")
  target_link_libraries(${name} PUBLIC gser)
  target_link_libraries(${name}_static PUBLIC gser_static)
  target_link_libraries(${name}_testing PUBLIC gser_testing)
endfunction()

# gser_configure_pc(<template> <output>): a pkg-config file whose prefix is
# found from the file's own place (${pcfiledir}), so that an installed tree
# can be moved or installed under any prefix.
function(gser_configure_pc template output)
  file(RELATIVE_PATH GSER_PC_TO_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
  set(GSER_PC_PREFIX "\${pcfiledir}/${GSER_PC_TO_PREFIX}")
  configure_file(${template} ${output} @ONLY)
endfunction()

# gser_install_library(<name> <pc template> <pc file>): install <name> and
# <name>_static into the package's export set, with the pkg-config file made
# from <pc template> (relative to the calling folder).
function(gser_install_library name pc_template pc_file)
  install(TARGETS ${name} ${name}_static EXPORT gserTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  gser_configure_pc(${pc_template} ${PROJECT_BINARY_DIR}/${pc_file})
  install(FILES ${PROJECT_BINARY_DIR}/${pc_file} DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endfunction()
