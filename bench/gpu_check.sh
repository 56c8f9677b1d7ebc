#!/usr/bin/env bash
# The CUDA checks in one command, for a machine with an NVIDIA GPU (under ~10 minutes):
#   1. tests/test_cuda.py (agcheck's CUDA tests: correct and broken, slow and fast mode,
#      forward mode, gradgradcheck, RNG states and inputs untouched);
#   2. a CUDA slice of the OpInfo sweep against torch's checker (one sample per op, slow and
#      fast mode, float64), verdicts compared;
#   3. bench/gpu_ratios.py: time and peak device memory, torch's checker beside agcheck.
# Outputs go to $OUT (the device tool's folder) or /tmp/agcheck-gpu.
#
# The machine needs torch with CUDA, numpy, pytest, rich and hypothesis (the project's
# device image has them) plus array-api-compat and expecttest; where those are missing,
# carry them as wheels in .whl/ (ignored by git), downloaded here with:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .whl \
#     array-api-compat==1.16.0 expecttest==0.3.0
# and run with the device tool's carry=[".whl"]: bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp/agcheck-gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
python3 - <<'PY' 2>&1 | tee "$out/summary.txt"
import torch, agcheck
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device'}; agcheck {agcheck.__version__}")
PY
status=0
echo "== CUDA tests" | tee -a "$out/summary.txt"
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$out/cuda-tests.txt" || status=1
tail -n 1 "$out/cuda-tests.txt" >> "$out/summary.txt"
echo "== OpInfo sweep on CUDA, against torch.autograd.gradcheck" | tee -a "$out/summary.txt"
ops="sin,exp,tanh,sigmoid,log,pow,div,mul,add,matmul,mm,sum,mean,prod,cumsum,softmax,log_softmax,norm,sort,max,linalg.solve,linalg.det,nn.functional.conv2d,nn.functional.layer_norm,nn.functional.gelu"
timeout 270 python3 -m tests.opinfo_sweep --device cuda --fast both --dtypes float64,complex128 --limit-samples 1 \
    --ops "$ops" --timeout 60 2>&1 | tee "$out/opinfo-cuda.txt" || status=1
tail -n 15 "$out/opinfo-cuda.txt" >> "$out/summary.txt"
echo "== time and device memory, torch's checker beside agcheck" | tee -a "$out/summary.txt"
timeout 150 python3 bench/gpu_ratios.py --repeat 3 2>&1 | tee "$out/gpu-ratios.txt" || status=1
cat "$out/gpu-ratios.txt" >> "$out/summary.txt"
exit $status
