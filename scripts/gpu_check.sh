#!/usr/bin/env bash
# The CUDA path of elastic-ring, measured in one command of at most 10 minutes on one GPU node (the
# Horovod build of --kit included): scripts/gpu_check.py, run by the Python that holds torch.
#
#   scripts/gpu_check.sh [--device cuda|cpu] [--out FILE] [--python PY] [--modes "M1 M2 .."] [--kit DIR]
#                        [--stages "S1 S2 .."] [--fail-at STAGE]
#
# --python PY (default .venv/bin/python, else python3): the Python of the check and its workers.
# Everything else, and the full help (--help), is scripts/gpu_check.py's. On a lent GPU machine
# whose device tool carries git-ignored folders only when named, carry the kit:
#
#   run(command='set -o pipefail; bash scripts/gpu_check.sh --kit .kit 2>&1 | tee "$OUT/gpu_check.log"',
#       carry=[".kit"], timeout_s=600)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${ROOT}/.venv/bin/python"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [[ "${args[i]}" == --python ]] && PY="${args[i + 1]:-}"
done
[[ -x "$PY" ]] || PY="$(command -v python3)"
exec "$PY" "$ROOT/scripts/gpu_check.py" "$@"
