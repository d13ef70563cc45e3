# Fails if clang-format would change any C++ or CUDA source under the listed directories.
file(GLOB_RECURSE sources
  ${SOURCE_DIR}/src/*.cpp ${SOURCE_DIR}/src/*.h ${SOURCE_DIR}/src/*.cu
  ${SOURCE_DIR}/include/*.h ${SOURCE_DIR}/include/*.cuh
  ${SOURCE_DIR}/kernels/*.cu ${SOURCE_DIR}/kernels/*.cpp
  ${SOURCE_DIR}/tests/*.cpp ${SOURCE_DIR}/tests/*.h ${SOURCE_DIR}/tests/*.cu
  ${SOURCE_DIR}/python/*.cu)
set(failed "")
foreach(f IN LISTS sources)
  execute_process(COMMAND ${CLANG_FORMAT} --dry-run --Werror ${f}
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    list(APPEND failed ${f})
  endif()
endforeach()
if(failed)
  list(JOIN failed "\n  " pretty)
  message(FATAL_ERROR "clang-format disagrees with:\n  ${pretty}\nRun: clang-format -i <files>")
endif()
list(LENGTH sources count)
message(STATUS "clang-format: ${count} files formatted")
