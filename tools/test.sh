#!/usr/bin/env bash
# Builds and runs every test of npumoe, as CI does: a release build with
# warnings as errors, an AddressSanitizer+UndefinedBehaviorSanitizer build,
# a ThreadSanitizer build of the threaded tests, and a short libFuzzer run of
# each parser. Installs what it needs (Debian).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
fuzz_seconds=${NM_FUZZ_SECONDS:-60}

# Debian packages the build and the tests use: the compilers, CMake, numpy for
# the independent reference (tests/ref), the Unicode database for the
# tokenizer's table check, clang's runtime for libFuzzer, and PyTorch with the
# KJV text for the training tool's test (tests/train); the Vulkan headers,
# glslc and Mesa's lavapipe (a CPU Vulkan driver) for the vulkan device's
# test (tests/test_vulkan.c, which must run: NM_REQUIRE_VULKAN); pkg-config
# to build an example against the installed library and to find jansson;
# jansson, the JSON library of the whole project (the calibration, profile
# and plan files, npumoe serve); libmicrohttpd (HTTP) for npumoe serve
# (NM_SERVE=ON); Node.js (with its npm) for the test that drives serve with
# the openai npm package, which npm installs into the build folder from the
# registry (cli_serve_openai); curl for the raw shapes of serve's answers
# (cli_serve).
packages=(gcc clang cmake make python3 python3-numpy unicode-data libclang-rt-14-dev
          python3-torch python3-regex bible-kjv bible-kjv-text
          libvulkan-dev glslc mesa-vulkan-drivers pkg-config libmicrohttpd-dev libjansson-dev
          nodejs curl)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
# Debian packages npm apart from nodejs; NodeSource's nodejs has it inside
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing: ${missing[*]}"
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi

export NM_REQUIRE_VULKAN=1

# Each step's name with the time, and at the end the seconds each took
# (CI's budget is 40 minutes; its log shows what to trim).
step_times=()
step_name=""
step_start=$SECONDS
step() {
    [ -z "$step_name" ] || step_times+=("$(printf '%5d s  %s' $((SECONDS - step_start)) "$step_name")")
    step_name=$1
    step_start=$SECONDS
    [ -z "$1" ] || echo "== $1   [$(date -u +%H:%M:%S) UTC, ${SECONDS} s in]"
}

step "release build (-Werror)"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DNM_WERROR=ON -DNM_VULKAN=ON -DNM_SERVE=ON
cmake --build build/release -j "$jobs"
step "release tests"
ctest --test-dir build/release --output-on-failure -j "$jobs"

# Whether this CPU runs kernel variant $1: the release command's own check,
# the one that makes the tests of a variant the CPU lacks skip.
cpu_runs() {
    NPUMOE_KERNELS=$1 build/release/npumoe info -m models/npumoe-tiny-moe.gguf >/dev/null 2>&1
}

step "install: examples/simple.c built against the installed library (pkg-config, find_package)"
# The static library, header, command and package files installed into a
# temporary prefix; the example built from them alone must print what
# `npumoe run --temp 0` prints (tests/install/check_simple.sh). Then a shared
# build: its SONAME carries the major version, and the example links to it.
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
model=models/npumoe-tiny-moe.gguf
version=$(sed -n 's/^#define NPUMOE_VERSION_STRING "\(.*\)"$/\1/p' include/npumoe.h)
cmake --install build/release --prefix "$prefix/static"
pc_dir=$(dirname "$(find "$prefix/static" -name npumoe.pc)")
# shellcheck disable=SC2046 # pkg-config's flags are words
cc -std=c11 -Wall -Wextra -Werror examples/simple.c -o "$prefix/simple-pkgconfig" \
    $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs --static npumoe)
bash tests/install/check_simple.sh "$prefix/simple-pkgconfig" "$prefix/static/bin/npumoe" "$model" "$version"
cmake -S tests/install -B "$prefix/find-package" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix/static" -DCMAKE_C_FLAGS="-Wall -Wextra -Werror"
cmake --build "$prefix/find-package" -j "$jobs"
bash tests/install/check_simple.sh "$prefix/find-package/simple" "$prefix/static/bin/npumoe" "$model"
cmake -S . -B build/shared -DCMAKE_BUILD_TYPE=Release -DNM_WERROR=ON -DNM_VULKAN=ON \
    -DBUILD_SHARED_LIBS=ON -DNM_TESTS=OFF
cmake --build build/shared -j "$jobs" --target npumoe_lib npumoe
cmake --install build/shared --prefix "$prefix/shared"
lib=$(find "$prefix/shared" -name "libnpumoe.so.${version%%.*}" | head -n 1)
dynamic=$(readelf -d "$lib") # whole, so grep -q cannot cut readelf's pipe (pipefail)
grep -q "SONAME.*\[libnpumoe\.so\.${version%%.*}\]" <<<"$dynamic" ||
    { echo "no SONAME libnpumoe.so.${version%%.*} in $lib:"; echo "$dynamic"; exit 1; }
# it exports the functions npumoe.h declares and nothing else (the linker
# version script of cmake/Install.cmake); the installed command, built on the
# header alone, runs on it (check_simple.sh below)
symbols=$(nm -D --defined-only "$lib") # whole, as readelf's above
exported=$(awk '{sub(/@.*/, "", $3); if ($3 !~ /^NPUMOE_/) print $3}' <<<"$symbols")
[ "$(wc -l <<<"$exported")" -ge 50 ] || { echo "$lib exports too few functions:"; echo "$exported"; exit 1; }
for sym in $exported; do
    grep -q "\b$sym(" include/npumoe.h || { echo "$lib exports $sym, which npumoe.h does not declare"; exit 1; }
done
! grep -qx nm_kernels_prepare <<<"$exported" ||
    { echo "$lib exports internal functions (nm_kernels_prepare)"; exit 1; }
pc_dir=$(dirname "$(find "$prefix/shared" -name npumoe.pc)")
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror examples/simple.c -o "$prefix/simple-shared" \
    $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs npumoe) -Wl,-rpath,"$(dirname "$lib")"
dynamic=$(readelf -d "$prefix/simple-shared")
grep -q "NEEDED.*\[libnpumoe\.so\.${version%%.*}\]" <<<"$dynamic" ||
    { echo "simple-shared does not load libnpumoe.so.${version%%.*}:"; echo "$dynamic"; exit 1; }
bash tests/install/check_simple.sh "$prefix/simple-shared" "$prefix/shared/bin/npumoe" "$model"
rm -rf "$prefix"
trap - EXIT

# The tile instructions in C (src/kernels/x86/amx-tile.h), so that the amx
# variant's layouts and loops are tested on every CPU that runs avx512vnni.
# Elsewhere the amx variant cannot run, emulated or not (its code around the
# tiles is avx512vnni's): those tests would all be skipped, so the build
# (2.5 minutes on 2 cores) is skipped with them. The release build's
# test_kernels_variants runs the emulated kernels wherever they can run.
if cpu_runs avx512vnni; then
    step "emulated AMX tiles (NM_AMX_EMULATE) build: the model and static-path tests with the amx variant"
    cmake -S . -B build/amx-emu -DCMAKE_BUILD_TYPE=Release -DNM_WERROR=ON -DNM_AMX_EMULATE=ON
    amx_tests=(test_model test_quant_models test_kernels_variants test_static test_device)
    cmake --build build/amx-emu -j "$jobs" --target "${amx_tests[@]}"
    step "emulated AMX tiles tests"
    NPUMOE_KERNELS=amx ctest --test-dir build/amx-emu --output-on-failure -j "$jobs" \
        -R "^(test_model_amx|test_quant_models_amx|test_kernels_variants|test_static|test_device)\$"
else
    echo "== emulated AMX tiles: skipped, this CPU does not run avx512vnni, around which the amx variant is built"
fi

# The AVX-512 and AMX kernel files are instrumented only where the CPU runs
# AVX-512: elsewhere no test or fuzzer runs their code, and instrumenting it
# took minutes of each sanitizer build.
san512=ON
cpu_runs avx512 || san512=OFF

step "AddressSanitizer + UndefinedBehaviorSanitizer build"
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNM_WERROR=ON -DNM_SANITIZE=ON \
    -DNM_SERVE=ON -DNM_SANITIZE_AVX512_KERNELS=$san512
cmake --build build/asan -j "$jobs"
step "AddressSanitizer + UndefinedBehaviorSanitizer tests"
ctest --test-dir build/asan --output-on-failure -j "$jobs"

step "ThreadSanitizer build: the tests that run the thread pool, the kernel scratch of threads, the cpu device, the executor, the repacking at load, batched decoding and routing over the pool"
cmake -S . -B build/tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNM_WERROR=ON -DNM_TSAN=ON \
    -DNM_SANITIZE_AVX512_KERNELS=$san512
tsan_tests=(test_kernels test_kernel_scratch test_model test_static test_device test_quant_models test_batch
            test_arch)
cmake --build build/tsan -j "$jobs" --target "${tsan_tests[@]}"
step "ThreadSanitizer tests"
TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build/tsan --output-on-failure -j "$jobs" \
    -R "^($(IFS='|'; echo "${tsan_tests[*]}"))\$"

step "libFuzzer build"
CC=clang cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNM_WERROR=ON \
    -DNM_SANITIZE=ON -DNM_FUZZ=ON -DNM_TESTS=ON -DNM_SANITIZE_AVX512_KERNELS=$san512
cmake --build build/fuzz -j "$jobs"
step "libFuzzer runs (${fuzz_seconds}s per target)"
ctest --test-dir build/fuzz --output-on-failure -L fuzz
step ""
echo "== every test passed, in ${SECONDS} s:"
printf '%s\n' "${step_times[@]}"
