#!/usr/bin/env bash
# Create (or update) the project virtualenv at .venv/ and install biasaudit into it.
#   scripts/setup.sh          runtime dependencies (what `audit` needs)
#   scripts/setup.sh --test   plus the test-only dependencies (pytest, hypothesis, wefe oracle, wordfreq)
# Versions are pinned by requirements.lock (pip constraints). Re-running is cheap: nothing is
# reinstalled unless pyproject.toml or requirements.lock changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), f"biasaudit needs Python 3.11, found {sys.version.split()[0]}"'
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=".venv/.biasaudit-installed${extras:+-test}"
want=$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch comes from the CPU wheel pinned in requirements.lock (no CUDA packages are pulled).
.venv/bin/pip install -q -c requirements.lock -e ".${extras}" 2> >(grep -v "^WARNING: Location" >&2)
# The packages installed without their dependencies (pyproject.toml [tool.biasaudit] no-deps), with or
# without --test: wefe 1.0.1 ships WEFE's word2vec sample (the default audit's `wefe-test-model`) and
# is the tests' oracle; its metadata pins numpy<1.27 and scipy<1.13, which we do not want, so it is
# installed without its dependencies (the ones its code imports are ours already).
no_deps=$(.venv/bin/python -c 'import tomllib
print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["tool"]["biasaudit"]["no-deps"]))')
# shellcheck disable=SC2086  # one word per package
.venv/bin/pip install -q --no-deps -c requirements.lock $no_deps 2> >(grep -v "^WARNING: Location" >&2)
echo "$want" > "$stamp"
