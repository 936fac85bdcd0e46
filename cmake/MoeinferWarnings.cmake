# moe_target_warnings(target): the project's warning flags (warning-free with -Wall -Wextra).
function(moe_target_warnings target)
  set(cxx_flags -Wall -Wextra -Wshadow=local -Wno-unused-parameter)
  if(MOEINFER_WERROR)
    list(APPEND cxx_flags -Werror)
  endif()
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${cxx_flags}>
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
endfunction()
