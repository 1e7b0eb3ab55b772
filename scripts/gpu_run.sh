#!/usr/bin/env bash
# One command for a lent GPU (docs/gpu.md): `turbovae doctor` first (its JSON in $OUT before anything else),
# then GPU tests, then the benchmark cases in priority order, each case's rows written to the results JSON in
# $OUT the moment it finishes.
#
#   bash scripts/gpu_run.sh                      # first call of a 15-minute lease: the essentials in <= 8 minutes
#   bash scripts/gpu_run.sh --resume FILE --skip-doctor --budget 270   # the second call, same warm machine
#   bash scripts/gpu_run.sh --dry-run            # CPU, tiny configs, same steps (the CI test runs this)
#
# The GPU tests run with bench/gpu_run.py's pytest_argv (--confcutdir tests, from the checkout), so they reach
# their assertions whatever the checkout's folder is called (docs/gpu.md says why).
#
# On the lent machine as it is: its own torch (never installed here), the package put on PYTHONPATH
# without installing anything, and only carried wheels (.whl/, made by scripts/fetch_gpu_wheels.sh) for
# what the machine lacks (diffusers, the eager-reference baseline). No network is needed.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
out=${OUT:-$repo/gpu_results}
mkdir -p "$out"
py=${PYTHON:-python3}

if ! "$py" -c "import torch" 2>/dev/null; then
    echo "gpu_run: $py has no torch; this script uses the machine's own torch and never installs it" >&2
    exit 2
fi

site=$(mktemp -d "${TMPDIR:-/tmp}/turbovae-site.XXXXXX")
if compgen -G ".whl/*.whl" >/dev/null; then
    if ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl; then
        echo "gpu_run: installing the carried wheels failed; cases that need them are reported as failed" >&2
    fi
else
    echo "gpu_run: no carried wheels in .whl/ (scripts/fetch_gpu_wheels.sh makes them); diffusers baselines will be reported as failed" >&2
fi
# The package without dependencies: a `turbovae` link to this checkout, first on the path.
mkdir -p "$site/pkg"
ln -sfn "$repo" "$site/pkg/turbovae"
export PYTHONPATH="$site/pkg:$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

"$py" -m turbovae.bench.gpu_run --out "$out" "$@" 2>&1 | tee -a "$out/run.log"
status=${PIPESTATUS[0]}
rm -rf "$site"
exit "$status"
