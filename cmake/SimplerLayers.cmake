# One folder = one OBJECT library (a layer, a runtime or a backend), linked
# only to the layers above it; libsimpler.so is the union of them all.
function(simpler_add_layer name)
  add_library(${name} OBJECT ${ARGN})
  set_property(GLOBAL APPEND PROPERTY SIMPLER_LAYER_TARGETS ${name})
endfunction()
