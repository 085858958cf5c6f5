#!/usr/bin/env bash
# Compiler launcher for the GPU machine's build (CMAKE_<LANG>_COMPILER_LAUNCHER).
# nvcc: the project's add_compile_options() also reach nvcc, which reads a bare -Werror as
# "-Werror <kind>" and swallows the next flag; hand it to the host compiler instead (and make
# nvcc's own warnings errors too).
# Any compiler: KAON_NO_WERROR=1 appends -Wno-error (a fallback when that machine's newer gcc
# warns where ours does not; the warnings stay visible in the log).
args=()
nvcc=0
case "$(basename "$1")" in nvcc*) nvcc=1 ;; esac
prev=
for a in "$@"; do
    if [ $nvcc = 1 ] && [ "$a" = -Werror ]; then
        args+=(-Xcompiler=-Werror -Werror=all-warnings)
    elif [ $nvcc = 1 ] && [ "$a" = all-warnings ] && [ "$prev" = -Werror ]; then
        :  # the kind of CMAKE_CUDA_FLAGS' "-Werror all-warnings", already given above
    else
        args+=("$a")
    fi
    prev=$a
done
if [ "${KAON_NO_WERROR:-0}" = 1 ]; then
    if [ $nvcc = 1 ]; then args+=(-Xcompiler=-Wno-error); else args+=(-Wno-error); fi
fi
exec "${args[@]}"
