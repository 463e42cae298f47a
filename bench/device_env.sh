# shellcheck shell=bash
# Sourced by the bench/*.sh scripts that run on the GPU machine, with $logs set to their log
# folder: installs the carried wheelhouse .whl/ (once per machine), sets the environment every
# process there runs in, and records the machine in $logs/machine.txt.
: "${logs:?bench/device_env.sh: set logs to the log folder before sourcing it}"
if compgen -G ".whl/*.whl" >/dev/null; then
    installed=/tmp/site/.wheels-$(printf '%s\n' .whl/*.whl | md5sum | cut -c1-12)
    if [ ! -e "$installed" ]; then
        python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl >"$logs/pip.log" 2>&1 && touch "$installed"
    fi
fi
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
# Bytecode cached as in an image whose packages were compiled at install (pip's default): the
# GPU machine's torch has no __pycache__, and compiling torch's, Dynamo's and transformers'
# sources in every process would add seconds to each start, the eager floor's and a replica's alike.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=$PWD/.bench-cache/pycache
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])'
  for package in timm transformers torchvision; do
      python3 -c "import $package; print('$package', $package.__version__)" 2>&1 | tail -1
  done
  echo "cores $(nproc)"; } >"$logs/machine.txt" 2>&1
