# simpler_add_kernel(<name> <sources>...)
# Builds one kernel as a shared object exporting
#   extern "C" void kernel_entry(int64_t* args)
# linked against simpler::simpler (for simpler_kernel_fail). Load it with
# KernelLibrary::add_file(func_id, core_type, $<TARGET_FILE:name>).
function(simpler_add_kernel name)
  add_library(${name} MODULE ${ARGN})
  target_link_libraries(${name} PRIVATE simpler::simpler)
  set_target_properties(${name} PROPERTIES PREFIX "" CXX_VISIBILITY_PRESET hidden)
endfunction()
