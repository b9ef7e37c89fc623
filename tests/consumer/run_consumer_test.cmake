# Installs the build into a scratch prefix, builds tests/consumer against it, and runs it: first
# as a consumer with no CUDA toolkit (hdk::hdk only, CUDAToolkit made unfindable), then with
# both libraries.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${HDK_BUILD_DIR} --prefix ${WORK_DIR}/prefix
  RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${status})")
endif()

function(build_and_run_consumer name)  # build_and_run_consumer <name> <cmake options...>
  set(build ${WORK_DIR}/${name})
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${build}
    -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
    # The consumer's compiler and standard library are the ones the package was built with.
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" ${ARGN}
    RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${name}: configuring the consumer against the installed hdk failed "
      "(${status})")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${build} RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${name}: building the consumer failed (${status})")
  endif()
  file(GLOB programs ${build}/consumer*)
  foreach(program IN LISTS programs)
    if(IS_DIRECTORY ${program})
      continue()
    endif()
    execute_process(COMMAND ${program} RESULT_VARIABLE status)
    if(NOT status EQUAL 0)
      message(FATAL_ERROR "${name}: ${program} failed (${status})")
    endif()
  endforeach()
endfunction()

build_and_run_consumer(without-cuda-toolkit -DHDK_CONSUMER_STATIC=OFF
  -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
# The consumer of libhdk.so links what it names and nothing of CUDA's.
find_program(READELF readelf)
if(READELF)
  execute_process(COMMAND ${READELF} -d ${WORK_DIR}/without-cuda-toolkit/consumer
    OUTPUT_VARIABLE dynamic)
  if(dynamic MATCHES "libcudart")
    message(FATAL_ERROR "the consumer of hdk::hdk links cudart itself:\n${dynamic}")
  endif()
endif()
build_and_run_consumer(both-libraries)
