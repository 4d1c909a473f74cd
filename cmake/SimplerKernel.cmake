# simpler_add_kernel(<name> <sources>...)
# Builds one kernel as a shared object <name>.so exporting
#   SIMPLER_KERNEL void kernel_entry(int64_t* args)   (simpler/kernel.h)
# linked against simpler::simpler (for simpler_kernel_fail). Every other symbol
# is hidden, so only SIMPLER_KERNEL's entry point is exported. Load it with
# KernelLibrary::add_file(func_id, core_type, path), the path given to the
# program for instance as a compile definition "$<TARGET_FILE:name>".
function(simpler_add_kernel name)
  add_library(${name} MODULE ${ARGN})
  target_link_libraries(${name} PRIVATE simpler::simpler)
  set_target_properties(${name} PROPERTIES PREFIX "" CXX_VISIBILITY_PRESET hidden)
endfunction()

# simpler_add_orchestration(<name> <sources>...)
# Builds one chip orchestration as a shared object <name>.so whose one
# exported symbol is the entry point SIMPLER_ORCHESTRATION(fn) defines
# (simpler/orchestration.h), linked against simpler::simpler (the
# ChipOrchestrator and TaskArgs it calls). Every other symbol is hidden, as
# for kernels. Load it with load_orchestration(path) and hand the result to
# ChipCallable; the path reaches the program as for kernels.
function(simpler_add_orchestration name)
  add_library(${name} MODULE ${ARGN})
  target_link_libraries(${name} PRIVATE simpler::simpler)
  set_target_properties(${name} PROPERTIES PREFIX "" CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
endfunction()
