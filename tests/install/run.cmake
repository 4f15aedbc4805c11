# Install the build tree into a scratch prefix and move the installed tree
# elsewhere (an install must not depend on where it was put), then build and
# run a consumer project with find_package(gser), its main.c by hand with
# pkg-config, and the installed tools, with no LD_LIBRARY_PATH.
#   -DBIN=<build tree> -DWORK=<scratch dir> -DCONSUMER=<project dir with main.c>
#   -DEXES=<targets to run, comma-separated> -DEXPECT=<regex their output must match>
#   -DPC=<pkg-config package> -DFLAGS=<extra C flags, e.g. sanitizers>
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BIN} --prefix ${WORK}/installed
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
file(RENAME ${WORK}/installed ${WORK}/prefix)
# The test hooks are for gser's own tests: their header is not installed,
# and no installed header includes it.
if(EXISTS ${WORK}/prefix/include/gser/testing.h)
  message(FATAL_ERROR "gser/testing.h (test hooks) was installed")
endif()
file(GLOB installed_headers ${WORK}/prefix/include/gser/*.h)
foreach(h ${installed_headers})
  file(STRINGS ${h} hits REGEX "#[ \t]*include[ \t]*[<\"]gser/testing\\.h")
  if(hits)
    message(FATAL_ERROR "the installed ${h} includes gser/testing.h")
  endif()
endforeach()
foreach(tool gser-demo-file gser-inspect)
  if(NOT EXISTS ${WORK}/prefix/bin/${tool})
    message(FATAL_ERROR "${tool} was not installed")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
                        ${WORK}/prefix/bin/gser-demo-file --out ${WORK}/demo.gser RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc)
  message(FATAL_ERROR "the installed gser-demo-file does not run: ${rc} ${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${WORK}/prefix/bin/gser-inspect ${WORK}/demo.gser
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc OR NOT out MATCHES "gser message")
  message(FATAL_ERROR "the installed gser-inspect does not run: ${rc} ${out} ${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER} -B ${WORK}/build
                        -DCMAKE_PREFIX_PATH=${WORK}/prefix "-DCMAKE_C_FLAGS=${FLAGS}" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
string(REPLACE "," ";" EXES "${EXES}")
foreach(exe ${EXES})
  execute_process(COMMAND ${WORK}/build/${exe} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc OR NOT out MATCHES "${EXPECT}")
    message(FATAL_ERROR "${exe} failed: ${rc} ${out} ${err}")
  endif()
endforeach()
find_program(PKG_CONFIG pkg-config)
if(PKG_CONFIG)
  file(GLOB pcdir ${WORK}/prefix/lib*/pkgconfig ${WORK}/prefix/lib/*/pkgconfig)
  set(ENV{PKG_CONFIG_PATH} "${pcdir}")
  # No --define-prefix: the .pc files must find their prefix themselves.
  execute_process(COMMAND ${PKG_CONFIG} --cflags --libs ${PC} OUTPUT_VARIABLE flags
                  RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc)
    message(FATAL_ERROR "pkg-config ${PC} failed")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags} ${FLAGS}")
  execute_process(COMMAND cc ${CONSUMER}/main.c ${flags} -o ${WORK}/pc_consumer RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "building with pkg-config flags failed")
  endif()
  string(FIND "${flags}" "${WORK}/prefix" at)
  if(at LESS 0)
    message(FATAL_ERROR "pkg-config ${PC} does not point into the moved prefix: ${flags}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${pcdir}/.. ${WORK}/pc_consumer
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  if(rc OR NOT out MATCHES "${EXPECT}")
    message(FATAL_ERROR "the pkg-config consumer failed: ${rc} ${out}")
  endif()
endif()
