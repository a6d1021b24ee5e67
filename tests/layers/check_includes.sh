#!/usr/bin/env bash
# The include rules of src/layers.txt, checked on every source file: no "../" paths, a public
# header only from the file's own layer or one it lists, a private header only from its own layer.
set -euo pipefail

src=${1:?usage: check_includes.sh SRC_DIR}
declare -A uses
while IFS= read -r line; do
  [[ $line =~ ^([a-z]+):(.*)$ ]] || continue
  uses[${BASH_REMATCH[1]}]=" ${BASH_REMATCH[2]} "
done <"$src/layers.txt"

problems=0
report() { echo "$1" >&2; problems=$((problems + 1)); }

for dir in "$src"/*/; do
  layer=$(basename "$dir")
  [[ -n ${uses[$layer]+set} ]] || report "src/$layer/ is not a layer of src/layers.txt"
done

# Which layer owns each public header; a name in two layers would be ambiguous.
declare -A owner
for header in "$src"/*/include/meshtrain/*.h; do
  name=meshtrain/$(basename "$header")
  layer=${header#"$src"/}
  layer=${layer%%/*}
  [[ -z ${owner[$name]+set} ]] || report "$name is public in both ${owner[$name]} and $layer"
  owner[$name]=$layer
done

# Every quoted include of every file, one "FILE:HEADER" line each.
while IFS=: read -r file include; do
  rel=${file#"$src"/}
  layer=${rel%%/*}
  where="src/$rel includes \"$include\""
  if [[ $include == *..* ]]; then
    report "$where: a \"..\" path ignores the layers' include folders; name the header by its layer's path"
  elif [[ $include == meshtrain/* ]]; then
    from=${owner[$include]-}
    if [[ -z $from ]]; then
      report "$where: no layer has this public header"
    elif [[ $from != "$layer" && ${uses[$layer]} != *" $from "* ]]; then
      allowed=$(xargs <<<"${uses[$layer]}")
      report "$where of layer $from, which $layer may not use (src/layers.txt: $layer uses ${allowed:-no other layer})"
    fi
  elif [[ ! -f ${file%/*}/$include && ! -f $src/$layer/$include ]]; then
    report "$where: not a private header of layer $layer"
  fi
done < <(find "$src" -name '*.[ch]' -print0 | sort -z |
           xargs -0 sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/; T; F; p' |
           paste -d: - -)

if ((problems)); then
  echo "check_includes: $problems include(s) break the layers of src/layers.txt" >&2
  exit 1
fi
echo "check_includes: every include of $(find "$src" -name '*.[ch]' | wc -l) files keeps to src/layers.txt"
