#!/usr/bin/env bash
# docs/pipelines.md: the hand-written part, then the parameter reference of every plugin, generated
# by `tessera plugins --format markdown` from the plugins' own declarations (between the markers).
#   scripts/gen_docs.sh [BUILD_DIR]           regenerate (after adding or changing a plugin)
#   scripts/gen_docs.sh --check [BUILD_DIR]   fail if the file is out of date (ctest: docs_pipelines_current)
# The build must be complete. Backends this build lacks (cuda without nvcc, say) keep their
# committed sections: --check does not compare them, and regenerating keeps them as they are.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
check=0
if [ "${1:-}" = "--check" ]; then
  check=1
  shift
fi
build=${1:-$src/build}
doc=$src/docs/pipelines.md
begin='<!-- BEGIN GENERATED: scripts/gen_docs.sh (tessera plugins --format markdown) -->'
end='<!-- END GENERATED -->'

[ -x "$build/bin/tessera" ] || { echo "gen_docs: no $build/bin/tessera; build first" >&2; exit 1; }
[ -f "$doc" ] || { echo "gen_docs: no $doc" >&2; exit 1; }
grep -qxF "$begin" "$doc" && grep -qxF "$end" "$doc" || { echo "gen_docs: $doc lacks the generated-section markers" >&2; exit 1; }

# Only the build's own plugins (its plugin folder beside libtessera_core), never a user's.
generated=$(TESSERA_PLUGIN_PATH= "$build/bin/tessera" plugins --format markdown)

# Sections of `## backend` in a reference, one "### `name`" block each: names, and one block's text.
backend_names() { awk '/^## /{b=($0=="## backend")} b && /^### `/{gsub(/^### `|`.*$/,""); print}'; }
backend_block() {
  awk -v want="### \`$1\`" '/^## /{b=($0=="## backend")} /^### /{on=(b && $0==want)} on'
}

committed=$(awk -v b="$begin" -v e="$end" '$0==e{on=0} on{print} $0==b{on=1}' "$doc")
missing=()
for name in $(echo "$committed" | backend_names); do
  echo "$generated" | backend_names | grep -qxF "$name" || missing+=("$name")
done
for name in "${missing[@]}"; do
  echo "gen_docs: backend '$name' is not built here; its documented section is kept unchecked" >&2
  generated+=$'\n\n'"$(echo "$committed" | backend_block "$name")"
done
# Keep the backend sections sorted by name, as tessera prints them, whatever was carried over.
if [ ${#missing[@]} -gt 0 ]; then
  head_part=$(echo "$generated" | awk '/^## backend$/{exit} {print}')
  intro=$(echo "$generated" | awk '/^## backend$/{on=1} on && /^### /{exit} on{print}')
  blocks=""
  for name in $(echo "$generated" | backend_names | sort -u); do
    blocks+="$(echo "$generated" | backend_block "$name")"$'\n\n'
  done
  generated="$head_part"$'\n\n'"$intro"$'\n\n'"$blocks"
fi
generated=$(echo "$generated" | cat -s)  # one blank line between blocks, none trailing

# Through the environment: awk -v would expand the backslashes of escaped table pipes.
new=$(GEN="$generated" awk -v b="$begin" -v e="$end" '
  $0==b{print; print ""; print ENVIRON["GEN"]; print ""; skip=1; next}
  $0==e{skip=0}
  !skip{print}' "$doc")

if [ $check -eq 1 ]; then
  if [ "$new" != "$(cat "$doc")" ]; then
    diff <(cat "$doc") <(echo "$new") | head -40 >&2 || true
    echo "docs/pipelines.md is out of date: run scripts/gen_docs.sh" >&2
    exit 1
  fi
  echo "docs/pipelines.md is current"
else
  echo "$new" >"$doc"
  echo "wrote $doc"
fi
