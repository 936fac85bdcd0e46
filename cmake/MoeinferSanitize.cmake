# MOEINFER_SANITIZE=address,undefined (any -fsanitize= list): every target of this build, the library
# and the tests alike, is compiled and linked with those sanitizers (scripts/sanitize.sh runs the tests
# so). A finding aborts the program (-fno-sanitize-recover), so that ctest sees it as a failure.
if(NOT MOEINFER_SANITIZE)
  return()
endif()
if(NOT MOEINFER_SANITIZE MATCHES "^[a-z,-]+$")
  message(FATAL_ERROR "MOEINFER_SANITIZE='${MOEINFER_SANITIZE}': expected a list such as address,undefined")
endif()
if(MOEINFER_BUILD_PYTHON)
  # The interpreter would have to preload the sanitizer runtime before the module could load.
  message(FATAL_ERROR "MOEINFER_SANITIZE needs -DMOEINFER_BUILD_PYTHON=OFF")
endif()
message(STATUS "moeinfer: sanitizers ${MOEINFER_SANITIZE}")
add_compile_options(
  $<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${MOEINFER_SANITIZE}>
  $<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=all>
  $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer>
  $<$<COMPILE_LANGUAGE:C,CXX>:-g>)
add_link_options(-fsanitize=${MOEINFER_SANITIZE})
