# Sourced by the GPU scripts: run the repo in place via PYTHONPATH (the GPU machine has torch + triton
# preinstalled and no network) and register the in-tree plugins' entry points without pip.
export PYTHONPATH="$PWD:$PWD/conformance_tests:$PWD/backends/triton_common:$PWD/backends/cuda:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
# Register the in-tree plugins' entry points without pip: a minimal dist-info on PYTHONPATH is what
# importlib.metadata (and so agoq's plugin discovery) reads.
EP=$(mktemp -d)
mk_ep() {  # dist, entry-point line
  mkdir -p "$EP/$1-0.0.0.dist-info"
  printf 'Metadata-Version: 2.1\nName: %s\nVersion: 0.0.0\n' "$1" > "$EP/$1-0.0.0.dist-info/METADATA"
  printf '[agoq.backends]\n%s\n' "$2" > "$EP/$1-0.0.0.dist-info/entry_points.txt"
}
mk_ep agoq-cuda "cuda = agoq_cuda.plugin"
export PYTHONPATH="$EP:$PYTHONPATH"
