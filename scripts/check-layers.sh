#!/usr/bin/env bash
# check-layers.sh: fails when a file includes a header of a layer above its
# own (docs/architecture.md, "Layers"). The build runs it before anything
# compiles, so an include that runs back up the layers stops the build.
#
# Each line of LAYERS is a folder and the folders its files may include
# from besides its own. A folder not listed (tests/, bench/, examples/) may
# include anything. A cuda/ folder belongs to the folder above it.
set -euo pipefail
cd "$(dirname "$0")/.."

LAYERS='
base
sched          base
config         base sched
tracer         base
db             base sched config tracer
report         base sched config tracer db
web            base sched config tracer db report
runner/model   base config
runner/comm    base config
runner/store   base
runner/worker  base sched config tracer runner/model runner/comm runner/store
runner/launch  base runner/store
runner/job     base sched config tracer db report web runner/model runner/comm runner/store runner/worker runner/launch
runner/cmd     base sched config tracer db report web runner/model runner/comm runner/store runner/worker runner/launch runner/job
runner         base sched config tracer db report web runner/model runner/comm runner/store runner/worker runner/launch runner/job runner/cmd
'

# The layer a path belongs to: its longest listed folder prefix.
layer_of() {
  local path=$1 best='' name
  while read -r name _; do
    [ -n "$name" ] || continue
    case "$path" in "$name"/*) [ ${#name} -gt ${#best} ] && best=$name ;; esac
  done <<<"$LAYERS"
  printf '%s' "$best"
}

allowed() { # allowed FROM TO: whether layer FROM may include from layer TO
  local from=$1 to=$2 name deps
  [ "$from" = "$to" ] && return 0
  while read -r name deps; do
    [ "$name" = "$from" ] || continue
    for d in $deps; do [ "$d" = "$to" ] && return 0; done
    return 1
  done <<<"$LAYERS"
  return 1
}

bad=0
while IFS= read -r file; do
  from=$(layer_of "$file")
  [ -n "$from" ] || continue
  while IFS= read -r inc; do
    to=$(layer_of "$inc")
    [ -n "$to" ] || continue # a system or third-party header
    if ! allowed "$from" "$to"; then
      echo "check-layers: $file includes \"$inc\": $from/ may not include from $to/ (a higher or unrelated layer; docs/architecture.md)" >&2
      bad=1
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
done < <(git ls-files --cached --others --exclude-standard -- '*.c' '*.h' '*.cu' 2>/dev/null ||
         find . -name '*.[ch]' -o -name '*.cu' | sed 's|^\./||')
exit $bad
