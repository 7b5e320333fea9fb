// Compiled by the layering tests (tests/CMakeLists.txt) with one part's include paths: it
// includes H2O_LAYER_HEADER, which that part may or may not see.
#define H2O_LAYER_STRING(x) #x
#define H2O_LAYER_INCLUDE(x) H2O_LAYER_STRING(x)
#include H2O_LAYER_INCLUDE(H2O_LAYER_HEADER)
