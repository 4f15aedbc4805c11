# Install the build tree into a scratch prefix, then build and run a consumer
# project with find_package(gser), and its main.c by hand with pkg-config.
#   -DBIN=<build tree> -DWORK=<scratch dir> -DCONSUMER=<project dir with main.c>
#   -DEXES=<targets to run, comma-separated> -DEXPECT=<regex their output must match>
#   -DPC=<pkg-config package> -DFLAGS=<extra C flags, e.g. sanitizers>
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BIN} --prefix ${WORK}/prefix
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
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
  execute_process(COMMAND ${PKG_CONFIG} --define-prefix --cflags --libs ${PC} OUTPUT_VARIABLE flags
                  RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc)
    message(FATAL_ERROR "pkg-config ${PC} failed")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags} ${FLAGS}")
  execute_process(COMMAND cc ${CONSUMER}/main.c ${flags} -o ${WORK}/pc_consumer RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "building with pkg-config flags failed")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${pcdir}/.. ${WORK}/pc_consumer
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  if(rc OR NOT out MATCHES "${EXPECT}")
    message(FATAL_ERROR "the pkg-config consumer failed: ${rc} ${out}")
  endif()
endif()
