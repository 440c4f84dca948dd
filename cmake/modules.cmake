# Helpers that give every module the same shape: one static library per src/ folder, with its
# allowed dependencies spelled out. Each module exports only its own headers: its include root
# (build/include/NAME) holds one link, FOLDER -> src/FOLDER, so "FOLDER/x.h" resolves only for targets
# that link cp_NAME, directly or through their dependencies. An include of a module that is not
# a dependency fails to compile; scripts/check_layering.sh checks the finer rules.

# chunkpipe_add_module(NAME SOURCES a.cpp ... DEPS other_module ... [PUBLIC_LIBS lib ...])
function(chunkpipe_add_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PUBLIC_LIBS;PRIVATE_LIBS" ${ARGN})
  add_library(cp_${name} STATIC ${ARG_SOURCES})
  get_filename_component(folder ${CMAKE_CURRENT_SOURCE_DIR} NAME)  # src/FOLDER/CMakeLists.txt
  set(root ${PROJECT_BINARY_DIR}/include/${name})
  file(MAKE_DIRECTORY ${root})
  file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR} ${root}/${folder} SYMBOLIC)
  target_include_directories(cp_${name} PUBLIC ${root})
  target_compile_options(cp_${name} PRIVATE ${CHUNKPIPE_WARNING_FLAGS})
  target_compile_options(cp_${name} PUBLIC ${CHUNKPIPE_ARCH_FLAGS})
  foreach(dep ${ARG_DEPS})
    target_link_libraries(cp_${name} PUBLIC cp_${dep})
  endforeach()
  target_link_libraries(cp_${name} PUBLIC ${ARG_PUBLIC_LIBS} PRIVATE ${ARG_PRIVATE_LIBS})
endfunction()

# chunkpipe_add_test(NAME SOURCES a_test.cpp ... DEPS module ... [LABELS unit|ops|model])
function(chunkpipe_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${CHUNKPIPE_WARNING_FLAGS})
  foreach(dep ${ARG_DEPS})
    target_link_libraries(${name} PRIVATE cp_${dep})
  endforeach()
  target_link_libraries(${name} PRIVATE GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    CHUNKPIPE_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
  add_test(NAME ${name} COMMAND ${name})
  if(ARG_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
endfunction()
