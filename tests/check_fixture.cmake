# Runs nm_gen_fixture (GEN) with the space-separated ARGS into OUT and fails
# unless OUT equals the COMMITTED model: the goldens beside it were made
# from exactly what the generator makes now.
separate_arguments(argv UNIX_COMMAND "${ARGS}")
execute_process(COMMAND ${GEN} ${argv} -o ${OUT} RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${GEN} failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${OUT} ${COMMITTED} RESULT_VARIABLE diff)
if(NOT diff EQUAL 0)
  message(FATAL_ERROR "${COMMITTED} differs from what nm_gen_fixture makes now: the goldens "
                      "beside it no longer describe the generator's model")
endif()
message(STATUS "1 passed, 0 failed")
