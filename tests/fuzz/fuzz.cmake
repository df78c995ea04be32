# The libFuzzer targets of tests/fuzz in the main build (docs/fuzzing.md),
# included by tests/CMakeLists.txt.
#
# They must be built with clang and its fuzzer runtime, whatever compiler
# builds the rest, so tests/fuzz is a project of its own that this build
# configures and builds with that clang (ExternalProject, into
# <build>/tests/fuzz). ST_FUZZ=AUTO (the default) builds it when clang
# (ST_FUZZ_CC, else clang-14, else clang) links a -fsanitize=fuzzer
# program; ON requires it; OFF never builds it. Each target gets a CTest
# entry fuzz_<name> (label "fuzz") that runs it for ST_FUZZ_SECONDS over
# its seeds and regression inputs; where the targets are not built, the
# entries are reported as skipped, with the reason.
set(ST_FUZZ "AUTO" CACHE STRING "Build the libFuzzer targets (tests/fuzz): AUTO, ON or OFF")
set_property(CACHE ST_FUZZ PROPERTY STRINGS AUTO ON OFF)
set(ST_FUZZ_SECONDS 8 CACHE STRING "How long each fuzz target runs under ctest")

set(st_fuzz_skip "")
if(ST_FUZZ STREQUAL "OFF")
  set(st_fuzz_skip "the fuzz targets are not built (ST_FUZZ=OFF)")
else()
  if(NOT ST_FUZZ_CC)
    find_program(ST_FUZZ_CC NAMES clang-14 clang)
  endif()
  if(NOT ST_FUZZ_CC)
    set(st_fuzz_skip "no clang to build the fuzz targets (install clang-14 and libclang-rt-14-dev)")
  else()
    # Does this clang link a fuzzer with the sanitizers? (libclang-rt-*-dev)
    set(probe_dir ${CMAKE_CURRENT_BINARY_DIR}/fuzz-probe)
    file(WRITE ${probe_dir}/probe.c
      "#include <stddef.h>\n#include <stdint.h>\n"
      "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);\n"
      "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }\n")
    execute_process(COMMAND ${ST_FUZZ_CC} -fsanitize=fuzzer,address,undefined probe.c -o probe
                    WORKING_DIRECTORY ${probe_dir} RESULT_VARIABLE probe_rc
                    OUTPUT_QUIET ERROR_QUIET)
    if(NOT probe_rc EQUAL 0)
      set(st_fuzz_skip "${ST_FUZZ_CC} cannot link -fsanitize=fuzzer,address,undefined (install libclang-rt-14-dev)")
    endif()
  endif()
  if(st_fuzz_skip AND ST_FUZZ STREQUAL "ON")
    message(FATAL_ERROR "ST_FUZZ=ON: ${st_fuzz_skip}")
  endif()
endif()

if(st_fuzz_skip)
  message(STATUS "sharedtensor: fuzz targets OFF: ${st_fuzz_skip}")
else()
  message(STATUS "sharedtensor: fuzz targets ON (${ST_FUZZ_CC})")
  include(ExternalProject)
  ExternalProject_Add(st_fuzz
    SOURCE_DIR ${CMAKE_CURRENT_SOURCE_DIR}/fuzz
    BINARY_DIR ${CMAKE_CURRENT_BINARY_DIR}/fuzz
    PREFIX ${CMAKE_CURRENT_BINARY_DIR}/fuzz-ep
    CMAKE_ARGS -DCMAKE_C_COMPILER=${ST_FUZZ_CC}
    BUILD_ALWAYS ON
    INSTALL_COMMAND "")
endif()

file(GLOB st_fuzz_srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_*.c)
foreach(src ${st_fuzz_srcs})
  get_filename_component(base ${src} NAME_WE)
  string(REGEX REPLACE "^fuzz_" "" short ${base})
  add_test(NAME fuzz_${short}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/run_short.sh ${CMAKE_CURRENT_BINARY_DIR}/fuzz
            ${short} ${ST_FUZZ_SECONDS})
  math(EXPR st_fuzz_timeout "${ST_FUZZ_SECONDS} + 120")
  set_tests_properties(fuzz_${short} PROPERTIES LABELS fuzz SKIP_RETURN_CODE 77
    TIMEOUT ${st_fuzz_timeout} ENVIRONMENT "ST_FUZZ_SKIP=${st_fuzz_skip}")
endforeach()
