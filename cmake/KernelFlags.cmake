# The per-ISA kernel files are compiled with their own instruction-set flags.
# Source-file properties belong to one CMake directory, so every directory
# that compiles the library's sources (the top level, tests/fuzz) calls this.
# In the libFuzzer build (clang), the kernel files are not instrumented:
# clang's ASan+UBSan on their always-inline tiles took over 5 minutes and
# 4 GiB per file (5 s without), the fuzzed parsers never reach them, and the
# gcc ASan+UBSan build tests them instrumented, all but avx512vnni.c with
# UBSan too: with it, gcc 12 took 27 minutes and 3.3 GB to compile that file
# (-O2 -g; ASan alone 4.5 minutes, neither 3), which made CI run past its time.
# With NM_SANITIZE_AVX512_KERNELS=OFF (tools/test.sh, on a CPU without
# AVX-512) the AVX-512 and AMX files are not instrumented in the sanitizer
# builds either: no test runs their code there.
function(nm_set_kernel_flags)
  set(no_san "")
  set(no_ubsan "")
  if(NM_FUZZ)
    set(no_san ";-fno-sanitize=all")
  elseif(NM_SANITIZE)
    set(no_ubsan ";-fno-sanitize=undefined")
  endif()
  set(no_san512 "${no_san}")
  if(NOT NM_SANITIZE_AVX512_KERNELS AND (NM_SANITIZE OR NM_TSAN))
    set(no_san512 ";-fno-sanitize=all")
  endif()
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
    set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/x86/avx2.c PROPERTIES
                                COMPILE_OPTIONS "-mavx2;-mfma;-mf16c${no_san}")
    set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/x86/avx2-int8.c PROPERTIES
                                COMPILE_OPTIONS "-mavx2;-mfma;-mf16c${no_san}")
    # the blocked attention runs under avx2 and every AVX-512 variant
    set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/x86/attention.c PROPERTIES
                                COMPILE_OPTIONS "-mavx2;-mfma;-mf16c${no_san}")
    set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/x86/attention-avx512.c PROPERTIES
                                COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mfma;-mf16c${no_san512}")
    # no -mfma: its multiplies and adds must stay apart, as ref.c's
    set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/x86/swiglu.c PROPERTIES
                                COMPILE_OPTIONS "-mavx2${no_san}")
    set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/x86/avx512.c PROPERTIES
                                COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mfma;-mf16c${no_san512}")
    set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/x86/avx512bf16.c PROPERTIES
                                COMPILE_OPTIONS
                                "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512bf16;-mfma;-mf16c${no_san512}")
    set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/x86/avx512vnni.c PROPERTIES
                                COMPILE_OPTIONS
                                "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx512bf16;-mfma;-mf16c${no_san512}${no_ubsan}")
    # amx.c: the tile instructions; amx-emu.c: the same source with them
    # emulated (no AMX flags, so nothing there can emit one)
    set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/x86/amx.c PROPERTIES
                                COMPILE_OPTIONS
                                "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx512bf16;-mfma;-mf16c;-mamx-tile;-mamx-int8;-mamx-bf16${no_san512}")
    set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/x86/amx-emu.c PROPERTIES
                                COMPILE_OPTIONS
                                "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx512bf16;-mfma;-mf16c${no_san512}")
  endif()
endfunction()
