# Fails, naming the files, when a C++ source of the project differs from what
# clang-format makes of it with the repository's .clang-format.
# cmake -DCLANG_FORMAT=<path> -DSOURCE_DIR=<repo> -P check_format.cmake
file(GLOB_RECURSE sources
  ${SOURCE_DIR}/src/*.h ${SOURCE_DIR}/src/*.cpp ${SOURCE_DIR}/include/*.h
  ${SOURCE_DIR}/tests/*.h ${SOURCE_DIR}/tests/*.cpp ${SOURCE_DIR}/bench/*.h ${SOURCE_DIR}/bench/*.cpp
  ${SOURCE_DIR}/examples/*.h ${SOURCE_DIR}/examples/*.cpp ${SOURCE_DIR}/fuzz/*.h ${SOURCE_DIR}/fuzz/*.cpp
  ${SOURCE_DIR}/python/*.h ${SOURCE_DIR}/python/*.cpp)
set(unformatted "")
foreach(f IN LISTS sources)
  execute_process(COMMAND ${CLANG_FORMAT} --style=file --dry-run --Werror ${f}
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    list(APPEND unformatted ${f})
  endif()
endforeach()
if(unformatted)
  list(JOIN unformatted "\n  " listed)
  message(FATAL_ERROR "not clang-formatted (run `make format`):\n  ${listed}")
endif()
list(LENGTH sources n)
message(STATUS "format: all ${n} sources follow .clang-format")
