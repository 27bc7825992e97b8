#!/usr/bin/env bash
# Collect every wheel multireduce needs on a machine with no network (air-gapped nodes, the GPU box).
#
#   deploy/wheelhouse.sh DIR [--python 3.12] [--cuda 13] [--with-cupy] [--with-dask-cuda] [--with-rmm] [--with-ucx]
#                            [--only-missing] [--no-self]
#
# --with-rmm adds RMM (local_cluster's default allocator for GPU workers where it is installed); --with-ucx
# adds distributed-ucxx and UCX for local_cluster(protocol="ucx"), RMM included.
#
# --no-self leaves multireduce's own wheel out: for a machine that imports a checkout (the GPU box runs
# the work tree with PYTHONPATH=/tmp/site:$PWD, where an installed copy in /tmp/site would shadow it).
#
# Then, on the offline machine:
#   python -m pip install --no-index --find-links DIR multireduce[cluster,cuda13]
# or, where the image already has numpy/cupy and only the Dask stack is missing (--only-missing):
#   python -m pip install --no-index --no-deps --target SITE DIR/*.whl && export PYTHONPATH=SITE
set -euo pipefail
dir=${1:?usage: deploy/wheelhouse.sh DIR [--python X.Y] [--cuda 12|13] [--with-cupy] [--with-dask-cuda] [--with-rmm] [--with-ucx] [--only-missing] [--no-self]}
shift
py=3.12 cuda=13 cupy=0 daskcuda=0 rmm=0 ucx=0 only_missing=0 self=1
while [ $# -gt 0 ]; do
  case $1 in
    --python) py=$2; shift 2 ;;
    --cuda) cuda=$2; shift 2 ;;
    --with-cupy) cupy=1; shift ;;
    --with-dask-cuda) daskcuda=1; shift ;;
    --with-rmm) rmm=1; shift ;;
    --with-ucx) ucx=1; rmm=1; shift ;;
    --only-missing) only_missing=1; shift ;;
    --no-self) self=0; shift ;;
    *) echo "deploy/wheelhouse.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dir"
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
fetch() {  # exact pins, no dependency resolution: the list below is the closure
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    "${platforms[@]}" -d "$dir" "$@"
}
# The Dask stack, pinned to what multireduce is tested with.
fetch dask==2026.7.1 distributed==2026.7.1 partd locket tblib zict tornado
if [ "$daskcuda" = 1 ]; then
  fetch dask-cuda==26.10.0 rapids-dask-dependency==26.10.0 pynvml nvidia-ml-py
fi
# RAPIDS 26.10's RMM and UCX, the versions dask-cuda 26.10 is tested with
if [ "$rmm" = 1 ]; then
  fetch "rmm-cu${cuda}==26.10.*" "librmm-cu${cuda}==26.10.*" rapids-logger
fi
if [ "$ucx" = 1 ]; then
  fetch "distributed-ucxx-cu${cuda}==0.52.*" "ucxx-cu${cuda}==0.52.*" "libucxx-cu${cuda}==0.52.*" \
    "libucx-cu${cuda}>=1.19,<1.22" "cuda-core>=0.5.1,<2" cuda-pathfinder
fi
if [ "$only_missing" = 0 ]; then
  fetch numpy click cloudpickle fsspec packaging pyyaml toolz jinja2 markupsafe msgpack psutil sortedcontainers
fi
if [ "$cupy" = 1 ]; then
  fetch "cupy-cuda${cuda}x" fastrlock
fi
# multireduce itself
[ "$self" = 1 ] && python3 -m pip wheel -q --no-deps -w "$dir" "$here"
ls "$dir"
