#!/bin/bash
# Installs what Mammoth needs on Debian 12, skipping everything already there.
#
#   bash tools/setup.sh
#
# 1. Debian packages (apt): Bazel 4 (bazel-bootstrap), Open MPI, Abseil, Catch2, liburing,
#    OpenBLAS, fio, PyTorch and NumPy for the reference checks, python3-venv, clang-format,
#    clang-16 with libFuzzer and its sanitizer runtimes (tools/fuzz.sh), libpng and libjpeg-turbo
#    (ViT image folders), cpp-httplib (the
#    server's HTTP).
#    `apt-get update` runs only when something is missing.
# 2. A Python virtual environment at $MAMMOTH_VENV (default ~/.cache/mammoth/venv) made from
#    Debian's /usr/bin/python3 with --system-site-packages, so it sees torch and numpy, plus the
#    PyPI clients the tests open our files with: safetensors, tokenizers, tensorboard,
#    transformers, peft, and the openai client that talks to `mammoth serve`.
#
# 3. Only with --bench-anchor: current PyTorch from PyPI (2.x, MKL / oneDNN, torch.compile) in a
#    SEPARATE venv at $MAMMOTH_ANCHOR_VENV (default ~/.cache/mammoth/venv-torch2), the anchor of
#    `mammoth bench train`. About 1 GB; never part of the default setup, the build or CI.
#
#   bash tools/setup.sh --bench-anchor
#
# Idempotent, and quick when everything is present. Runs as root, or as a user with sudo.
# The CUDA toolkit is not installed here: the build uses /usr/local/cuda when it exists.
set -euo pipefail

bench_anchor=0
for arg in "$@"; do
  case "$arg" in
    --bench-anchor) bench_anchor=1 ;;
    *)
      echo "[setup] unknown argument '$arg' (the only one is --bench-anchor)" >&2
      exit 2
      ;;
  esac
done

PACKAGES=(
  bazel-bootstrap
  g++
  binutils
  openmpi-bin
  libopenmpi-dev
  libabsl-dev
  catch2
  liburing-dev
  libopenblas-dev
  fio
  python3-torch
  python3-numpy
  python3-venv
  clang-format
  clang-16
  libfuzzer-16-dev
  libclang-rt-16-dev
  libcpp-httplib-dev
  libpng-dev
  libjpeg62-turbo-dev
)
# jinja2: transformers' apply_chat_template, the reference of the chat-template tests.
PY_MODULES=(safetensors tokenizers tensorboard transformers peft openai jinja2)
# What pip installs for each module above. transformers 4.44.2 is the newest that runs on
# Debian's torch 1.13; it pins tokenizers < 0.20 (pip resolves that). peft and accelerate ask
# for torch >= 1.13, which Debian's "1.13.0a0" does not satisfy for pip (a pre-release), so pip
# would fetch torch 2 with its CUDA wheels: they install without dependencies, theirs listed.
declare -A PY_SPEC=([transformers]="transformers==4.44.2"
  [peft]="--no-deps peft==0.12.0 accelerate==0.33.0")
PEFT_DEPS=(psutil pyyaml huggingface_hub tqdm packaging)

MAMMOTH_VENV="${MAMMOTH_VENV:-$HOME/.cache/mammoth/venv}"

say() { echo "[setup] $*"; }

as_root() {
  if [[ "$(id -u)" == 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "[setup] need root (or sudo) to run: $*" >&2
    exit 1
  fi
}

# --- Debian packages ---------------------------------------------------------------------
missing=()
for pkg in "${PACKAGES[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  say "Debian packages: all ${#PACKAGES[@]} present"
else
  say "Debian packages missing: ${missing[*]}"
  say "apt-get update"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
  say "apt-get install ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# --- Python virtual environment -------------------------------------------------------------
venv_python="$MAMMOTH_VENV/bin/python"
if [[ ! -x "$venv_python" ]] || ! "$venv_python" -c 'import sys' >/dev/null 2>&1; then
  say "creating venv $MAMMOTH_VENV (system site packages: torch, numpy)"
  mkdir -p "$(dirname "$MAMMOTH_VENV")"
  /usr/bin/python3 -m venv --system-site-packages "$MAMMOTH_VENV"
else
  say "venv: $MAMMOTH_VENV"
fi

# find_spec locates a module without importing it (importing torch or tensorboard takes seconds).
find_missing_modules() {
  "$venv_python" - "$@" <<'PY'
import importlib.util
import sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
PY
}
read -r -a missing_py <<<"$(find_missing_modules "${PY_MODULES[@]}")"
if [[ ${#missing_py[@]} -eq 0 ]]; then
  say "Python modules: ${PY_MODULES[*]} present"
else
  specs=()
  for m in "${missing_py[@]}"; do
    spec="${PY_SPEC[$m]:-$m}"
    if [[ "$spec" == --no-deps* ]]; then
      read -r -a spec_args <<<"$spec"
      say "pip install ${spec_args[*]} (then ${PEFT_DEPS[*]})"
      "$venv_python" -m pip install -q --disable-pip-version-check "${spec_args[@]}"
      "$venv_python" -m pip install -q --disable-pip-version-check "${PEFT_DEPS[@]}"
    else
      specs+=("$spec")
    fi
  done
  if [[ ${#specs[@]} -gt 0 ]]; then
    say "pip install ${specs[*]}"
    "$venv_python" -m pip install -q --disable-pip-version-check "${specs[@]}"
  fi
fi
read -r -a missing_sys <<<"$(find_missing_modules torch numpy)"
if [[ ${#missing_sys[@]} -ne 0 ]]; then
  echo "[setup] the venv does not see Debian's ${missing_sys[*]} (python3-torch, python3-numpy);" \
    "remove $MAMMOTH_VENV and rerun" >&2
  exit 1
fi

# --- The PyTorch 2.x benchmark anchor (--bench-anchor only) -----------------------------------
# PyPI's torch wheel links a few NVIDIA runtime libraries even when it runs on the CPU; beside
# /usr/local/cuda these four, installed without their dependencies, were enough (issue 27). The
# venv has no system site packages so Debian's torch 1.13 cannot shadow it. bin/python-anchor
# sets the library path those libraries need and runs the venv's python: the bench calls that.
MAMMOTH_ANCHOR_VENV="${MAMMOTH_ANCHOR_VENV:-$HOME/.cache/mammoth/venv-torch2}"
ANCHOR_NVIDIA=(nvidia-cufile nvidia-cusparselt-cu13 nvidia-nvshmem-cu13 nvidia-nccl-cu13)
ANCHOR_DEPS=(numpy typing_extensions sympy filelock jinja2 networkx fsspec setuptools)
if [[ "$bench_anchor" == 1 ]]; then
  anchor_python="$MAMMOTH_ANCHOR_VENV/bin/python"
  if [[ ! -x "$anchor_python" ]]; then
    say "creating anchor venv $MAMMOTH_ANCHOR_VENV (no system site packages)"
    mkdir -p "$(dirname "$MAMMOTH_ANCHOR_VENV")"
    /usr/bin/python3 -m venv "$MAMMOTH_ANCHOR_VENV"
  fi
  if "$anchor_python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is None)'
  then
    say "anchor venv: torch present"
  else
    say "pip install ${ANCHOR_DEPS[*]}"
    "$anchor_python" -m pip install -q --disable-pip-version-check "${ANCHOR_DEPS[@]}"
    say "pip install --no-deps torch ${ANCHOR_NVIDIA[*]} (~1 GB)"
    "$anchor_python" -m pip install -q --disable-pip-version-check --no-deps torch \
      "${ANCHOR_NVIDIA[@]}"
  fi
  site="$("$anchor_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  nv="$site/nvidia"
  {
    echo '#!/bin/bash'
    echo '# Made by tools/setup.sh --bench-anchor: PyPI torch with the NVIDIA libraries it links.'
    echo "export LD_LIBRARY_PATH=\"$nv/nccl/lib:/usr/local/cuda/lib64:$nv/cu13/lib:$nv/nvshmem/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
    echo "exec \"$anchor_python\" \"\$@\""
  } >"$MAMMOTH_ANCHOR_VENV/bin/python-anchor"
  chmod +x "$MAMMOTH_ANCHOR_VENV/bin/python-anchor"
  version="$("$MAMMOTH_ANCHOR_VENV/bin/python-anchor" -c 'import torch; print(torch.__version__)')" ||
    { echo "[setup] the anchor's torch does not import; see above" >&2; exit 1; }
  say "anchor: torch $version via $MAMMOTH_ANCHOR_VENV/bin/python-anchor"
fi

# --- What the build will use -----------------------------------------------------------------
if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  say "CUDA toolkit: /usr/local/cuda (CUDA backend will be built)"
else
  say "CUDA toolkit: none at /usr/local/cuda (CPU-only build)"
fi
say "done"
