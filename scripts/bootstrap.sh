# Sourced by scripts/dev and scripts/test: create .venv and install Kiwi into it when
# pyproject.toml or constraints.txt changed since the last install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "kiwi: creating .venv" >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.kiwi-installed
want="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1) ${KIWI_EXTRAS:-}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "kiwi: installing dependencies into .venv" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".${KIWI_EXTRAS:+[$KIWI_EXTRAS]}"
  echo "$want" > "$stamp"
fi
