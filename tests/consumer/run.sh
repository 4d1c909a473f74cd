#!/usr/bin/env bash
# simpler as a user gets it. Installs the build tree into a scratch prefix
# (not the configure-time one) and moves the prefix elsewhere; then, from the
# moved prefix, the installed `simpler` must load the examples' kernels from
# that prefix and pass its demo, and the consumer project must configure,
# build and run against it. Args: <build dir> <source dir>.
set -euo pipefail
build=$1 src=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
mv "$scratch/prefix" "$scratch/moved"
prefix=$scratch/moved
unset SIMPLER_KERNEL_DIR

# The build tree still holds the same kernels: the installed binary must say it
# uses its own, or a demo that passed would prove nothing.
info=$("$prefix/bin/simpler" info)
if ! grep -q "^example kernels: $prefix/" <<<"$info"; then
  echo "the installed simpler does not load its own kernels:"
  grep "^example kernels:" <<<"$info" || echo "(no 'example kernels:' line)"
  exit 1
fi
"$prefix/bin/simpler" demo >"$scratch/demo.log" || { cat "$scratch/demo.log"; exit 1; }
echo "installed simpler demo: ok"

cmake -S "$src/tests/consumer" -B "$scratch/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$scratch/build" >/dev/null
"$scratch/build/consumer"
