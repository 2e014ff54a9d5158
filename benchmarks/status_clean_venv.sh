#!/usr/bin/env bash
# status_cost.py --gpu-worker in a venv of the console's own: psutil and
# nvidia-ml-py only, unpacked from the wheels in .whl/ (carried to the GPU
# machine; `pip download psutil nvidia-ml-py --no-deps -d .whl`). The GPU
# machine's shared venv runs a numba-cuda .pth hook at every interpreter start
# (~40 ms of its `python -c pass`, benchmarks/RESULTS.md), which no install of
# the console has. Run from the repository root: bash benchmarks/status_clean_venv.sh WORKDIR
set -eu
WORK=${1:?usage: status_clean_venv.sh WORKDIR}
PY=${PY:-python3}
venv=$WORK/console-venv
rm -rf "$venv"
$PY -m venv --without-pip "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for whl in .whl/psutil-*.whl .whl/nvidia_ml_py-*.whl .whl/typer-*.whl .whl/click-*.whl .whl/rich-*.whl .whl/shellingham-*.whl .whl/typing_extensions-*.whl .whl/markdown_it_py-*.whl .whl/mdurl-*.whl .whl/pygments-*.whl .whl/annotated_doc-*.whl; do "$venv/bin/python" -m zipfile -e "$whl" "$site"; done
"$venv/bin/python" -c 'import psutil, pynvml, sys; print("console venv:", sys.prefix, "psutil", psutil.__version__)'
exec "$venv/bin/python" benchmarks/status_cost.py --dir "$WORK/status-clean" --log-gb 1 --repeat 7 --gpu-worker \
  --worker-python "$(command -v $PY)"
