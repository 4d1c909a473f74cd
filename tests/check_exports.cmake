# cmake -DNM=<nm> -DFILE=<shared object> -DEXPECTED=<symbol> -P check_exports.cmake
# Fails unless EXPECTED is the one symbol of its own FILE defines in its
# dynamic symbol table. The standard library's typeinfo and vtables that the
# headers instantiate (std::bad_variant_access, from Result<T>::value) are not
# its own: libstdc++ declares namespace std with default visibility so that
# its exceptions can be caught across shared objects.
execute_process(COMMAND ${NM} -D --defined-only ${FILE} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${FILE}")
endif()
string(REGEX REPLACE "[0-9a-fA-F]+ [A-Za-z] " "" symbols "${out}")
string(STRIP "${symbols}" symbols)
string(REPLACE "\n" ";" symbols "${symbols}")
list(FILTER symbols EXCLUDE REGEX "^_ZT[ISV]N?St")
if(NOT symbols STREQUAL EXPECTED)
  message(FATAL_ERROR "${FILE} exports [${symbols}], want exactly [${EXPECTED}]")
endif()
message(STATUS "${FILE} exports only ${EXPECTED} (and std typeinfo)")
